//! `h64`: the one hash magpie uses for keys, table positions and fingerprints.
//!
//! BLAKE2b with an 8-byte digest, read big-endian. The digest length is part of
//! BLAKE2b's parameter block, so this is *not* the first 8 bytes of BLAKE2b-512.
//! The function is fixed and documented so that every instance, every build and
//! every other implementation of the same experiment agree: a toolchain upgrade
//! must never remap a fleet (which is why `DefaultHasher` is never used).

use blake2b_simd::many::{HashManyJob, hash_many};
use blake2b_simd::{Hash, Params, State};

/// BLAKE2b-64 of `bytes`, read as a big-endian `u64`.
pub fn h64(bytes: &[u8]) -> u64 {
    to_u64(Params::new().hash_length(8).hash(bytes))
}

/// `h64` over several byte strings, as if they were concatenated, without
/// allocating the concatenation.
pub fn h64_parts(parts: &[&[u8]]) -> u64 {
    let mut state: State = Params::new().hash_length(8).to_state();
    for part in parts {
        state.update(part);
    }
    to_u64(state.finalize())
}

/// `h64` of each input, appended to `out` in input order: the same values as
/// calling [`h64`] on each, but the SIMD back end compresses several inputs
/// side by side (four at a time with AVX2), which is worth it wherever many
/// short strings are hashed at once (node names, ring points, lab keys).
pub fn h64_many<'a>(inputs: impl IntoIterator<Item = &'a [u8]>, out: &mut Vec<u64>) {
    // Small batches keep the jobs (about 100 bytes each) in L1.
    const BATCH: usize = 32;
    let mut params = Params::new();
    params.hash_length(8);
    let mut jobs: Vec<HashManyJob<'a>> = Vec::with_capacity(BATCH);
    let mut inputs = inputs.into_iter();
    loop {
        jobs.clear();
        jobs.extend(
            inputs
                .by_ref()
                .take(BATCH)
                .map(|i| HashManyJob::new(&params, i)),
        );
        if jobs.is_empty() {
            return;
        }
        hash_many(jobs.iter_mut());
        out.extend(jobs.iter().map(|j| to_u64(j.to_hash())));
    }
}

/// The 8-byte digest as a big-endian `u64`.
fn to_u64(hash: Hash) -> u64 {
    let bytes: [u8; 8] = hash
        .as_bytes()
        .try_into()
        .expect("the digest length is set to 8");
    u64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed with Python's `hashlib.blake2b(digest_size=8)`.
    #[test]
    fn golden_vectors() {
        assert_eq!(h64(b""), 0xe4a6a0577479b2b4);
        assert_eq!(h64(b"user:0"), 0x2b6e5f8c3559ee21);
        assert_eq!(h64(b"user:99999"), 0x0523a5c22ed03f0c);
        assert_eq!(h64(b"3#17"), 0x105ba1f3c1adb049);
        assert_eq!(h64(b"10|user:42"), 0xa44e712ea5f71159);
    }

    #[test]
    fn parts_equal_concatenation() {
        assert_eq!(h64_parts(&[b"10", b"|", b"user:42"]), h64(b"10|user:42"));
        assert_eq!(h64_parts(&[]), h64(b""));
    }

    #[test]
    fn many_equals_one_at_a_time() {
        // Lengths around the 128-byte block edge, and counts that leave a
        // partial batch and a partial group of four.
        let texts: Vec<Vec<u8>> = (0..103usize)
            .map(|i| (0..(i * 7) % 260).map(|j| (i + j) as u8).collect())
            .collect();
        let mut got = vec![1];
        h64_many(texts.iter().map(|t| t.as_slice()), &mut got);
        let want: Vec<u64> = std::iter::once(1)
            .chain(texts.iter().map(|t| h64(t)))
            .collect();
        assert_eq!(got, want);
        h64_many([b"user:0".as_slice()], &mut got);
        assert_eq!(got.last(), Some(&0x2b6e5f8c3559ee21));
    }
}
