//! The hashes a request, connection or flow is routed by, each a type of
//! its own so that one cannot be passed for another: the session key (its
//! pin, its key memory; the table's key when it has no group), the group
//! key (`key.group`: what the table is looked up by), the opening (how a
//! conversation opens, `queue`), the shared head (what of a prompt other
//! conversations share, `queue`) and the tenant (`queue.tenant`).
//!
//! Each is an `h64` of what the config names ([`magpie_core::key`]); the
//! table itself is looked up by a bare hash ([`Keys::table`]), as the
//! placement core takes it.

/// The key that names a conversation, connection or flow: its session pin,
/// its record in the key memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey(u64);

/// The key of a request's group (`key.group`): conversations that share a
/// head share it, and the table is looked up by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey(u64);

/// How a conversation opens (its model, instructions and first user
/// message), when its body was read for a key: under a `queue`, a
/// conversation that opens alike waits where the latest such went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OpeningKey(u64);

/// Whose request it is (`queue.tenant`), for the queue's turns; the
/// default is no tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct TenantKey(u64);

/// Where a record is kept in the key memory
/// ([`crate::routing::key_memory`]): a session key's under its own hash, an
/// opening's under its hash with a fixed pattern flipped, so that it is no
/// session key's (with `key.from: conversation` the session key is the
/// opening itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MemoryKey(u64);

impl SessionKey {
    pub(crate) const fn new(hash: u64) -> SessionKey {
        SessionKey(hash)
    }

    /// The hash it stands for.
    pub(crate) const fn hash(self) -> u64 {
        self.0
    }

    /// Where its record is kept in the key memory.
    pub(crate) const fn memory(self) -> MemoryKey {
        MemoryKey(self.0)
    }
}

impl GroupKey {
    pub(crate) const fn new(hash: u64) -> GroupKey {
        GroupKey(hash)
    }

    /// The hash it stands for.
    pub(crate) const fn hash(self) -> u64 {
        self.0
    }
}

impl OpeningKey {
    pub(crate) const fn new(hash: u64) -> OpeningKey {
        OpeningKey(hash)
    }

    /// The hash it stands for.
    pub(crate) const fn hash(self) -> u64 {
        self.0
    }

    /// Where its record is kept in the key memory, apart from any session
    /// key's.
    pub(crate) const fn memory(self) -> MemoryKey {
        MemoryKey(self.0 ^ 0x6f70_656e_696e_6773) // "openings"
    }
}

impl TenantKey {
    /// No tenant: requests without one take their turns as one.
    pub(crate) const NONE: TenantKey = TenantKey(0);

    pub(crate) const fn new(hash: u64) -> TenantKey {
        TenantKey(hash)
    }

    /// A tenant told by its group (`queue.tenant: group`), or none.
    pub(crate) fn of_group(group: Option<GroupKey>) -> TenantKey {
        group.map_or(TenantKey::NONE, |g| TenantKey(g.0))
    }

    /// The hash it stands for.
    pub(crate) const fn hash(self) -> u64 {
        self.0
    }
}

impl MemoryKey {
    /// The hash its record is kept under.
    pub(crate) const fn hash(self) -> u64 {
        self.0
    }
}

/// The head a request shares with other conversations (`queue`): its
/// system head (model, instructions, tools), else its group's head. A
/// backend that served it lately likely still caches it; with a shared
/// store, where the fleet served it is kept for the others
/// ([`crate::routing::sessions::placed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedHead {
    Group(GroupKey),
    System(u64),
}

impl SharedHead {
    /// The head of a request of `group` whose body shares `heads`
    /// ([`crate::routing::llm::work::Heads`]: the group's head's bytes, the
    /// system head's hash and bytes).
    pub(crate) fn of(
        group: Option<GroupKey>,
        group_bytes: u64,
        system: Option<u64>,
    ) -> Option<SharedHead> {
        match (system, group) {
            (Some(hash), _) => Some(SharedHead::System(hash)),
            (None, Some(group)) if group_bytes > 0 => Some(SharedHead::Group(group)),
            _ => None,
        }
    }

    /// Its name in the store: its kind and hash.
    pub(crate) fn name(self) -> String {
        match self {
            SharedHead::Group(group) => format!("g{:016x}", group.hash()),
            SharedHead::System(hash) => format!("s{hash:016x}"),
        }
    }
}

/// The keys of one request (a connection or a flow has a session key only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) session: SessionKey,
    pub(crate) group: Option<GroupKey>,
    /// How its conversation opens, when its body was read for a key (mode
    /// http).
    pub(crate) opening: Option<OpeningKey>,
    /// Its chat body is a later turn of its conversation: a binding made by
    /// an earlier turn is worth waiting longer for
    /// ([`crate::routing::sessions::store::Store::deadline_for`]).
    pub(crate) later_turn: bool,
    /// The head it shares with other conversations, when its body was read
    /// for a key and has one.
    pub(crate) head: Option<SharedHead>,
}

impl Keys {
    /// A session key alone (no group, no opening, not a later turn).
    pub(crate) fn single(session: SessionKey) -> Keys {
        Keys {
            session,
            group: None,
            opening: None,
            later_turn: false,
            head: None,
        }
    }

    /// The key the table is looked up by: the group's, else the session's.
    pub(crate) fn table(&self) -> u64 {
        self.group.map_or(self.session.0, |g| g.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_looked_up_by_the_group_when_there_is_one() {
        let single = Keys::single(SessionKey::new(7));
        assert_eq!(single.table(), 7);
        let grouped = Keys {
            group: Some(GroupKey::new(9)),
            ..single
        };
        assert_eq!(grouped.table(), 9);
        assert_eq!(TenantKey::of_group(grouped.group), TenantKey::new(9));
        assert_eq!(TenantKey::of_group(None), TenantKey::NONE);
    }

    #[test]
    fn an_openings_record_is_kept_apart_from_the_same_hashs_session() {
        let (session, opening) = (SessionKey::new(7), OpeningKey::new(7));
        assert_eq!(session.memory().hash(), 7);
        assert_ne!(opening.memory(), session.memory());
    }

    #[test]
    fn a_shared_head_is_the_system_head_else_a_group_head_of_some_bytes() {
        let group = Some(GroupKey::new(9));
        let system = SharedHead::of(group, 4000, Some(5));
        assert_eq!(system, Some(SharedHead::System(5)));
        assert_eq!(
            SharedHead::of(group, 4000, None),
            Some(SharedHead::Group(GroupKey::new(9)))
        );
        assert_eq!(SharedHead::of(group, 0, None), None);
        assert_eq!(SharedHead::of(None, 4000, None), None);
        let names =
            [SharedHead::System(9), SharedHead::Group(GroupKey::new(9))].map(SharedHead::name);
        assert_eq!(names, ["s0000000000000009", "g0000000000000009"]);
    }
}
