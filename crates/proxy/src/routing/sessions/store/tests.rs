//! The store's own rules, without a server.

use super::*;
use redis::{ErrorKind, RedisError, ServerErrorKind};

#[test]
fn only_a_failed_store_backs_off_not_a_refused_operation() {
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(store_wide(&io));
    let loading = RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
    assert!(store_wide(&loading));
    let parse = RedisError::from((ErrorKind::Parse, "bad reply"));
    assert!(store_wide(&parse));
    for refused in [
        ErrorKind::Server(ServerErrorKind::ResponseError),
        ErrorKind::Extension,
        ErrorKind::UnexpectedReturnType,
    ] {
        let e = RedisError::from((refused, "one operation"));
        assert!(!store_wide(&e), "{e}");
    }
}

#[tokio::test]
async fn a_name_over_the_bound_is_never_sent_to_the_store() {
    let config = RedisConfig {
        addr: "127.0.0.1:1".to_string(),
        prefix: "magpie:".to_string(),
        timeout: Duration::from_millis(20),
        username: None,
        password: None,
    };
    let store = Store::new(config, Duration::from_secs(60));
    let long = "x".repeat(MAX_BINDING + 1);
    assert_eq!(store.pin(1, &long, |_| true, store.deadline()).await, None);
    assert_eq!(store.stats.ops(OpResult::Skipped), 0, "the store was asked");
    assert_eq!(store.stats.fallbacks(), 0);
    // A name within the bound is asked for (and skipped: no connection).
    let longest = "x".repeat(MAX_BINDING);
    assert_eq!(
        store.pin(1, &longest, |_| true, store.deadline()).await,
        None
    );
    assert_eq!(store.stats.ops(OpResult::Skipped), 1);
}
