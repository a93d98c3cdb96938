// The corpus files of a fuzz target, read for the corpus replay tests of
// both crates (`include!`d by each `tests/fuzz_corpus.rs`).

/// Every file in `fuzz/corpus/<target>/`, with its bytes; never empty.
pub fn corpus(target: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut inputs = Vec::new();
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            inputs.push((path, bytes));
        }
    }
    assert!(!inputs.is_empty(), "{} has no inputs", dir.display());
    inputs
}
