// The check of the `config` fuzz target, included (`include!`) by the
// target and by the corpus replay test, so both assert the same.
//
// Input: YAML text, parsed and validated without DNS. A rejected text gets
// problems that name the file and a place inside the text; an accepted one
// is accepted again alike and builds a table with the same fingerprint.

use std::path::Path;
use std::sync::Arc;

use magpie_proxy::Snapshot;
use magpie_proxy::config::Config;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let config = match Config::parse_offline(file, text) {
        Ok(config) => config,
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a rejection names a problem");
            // YAML's line breaks: `\r\n`, `\n` and a lone `\r`.
            let lines = text.replace("\r\n", "\n").matches(['\n', '\r']).count() as u64 + 1;
            for e in &errors.0 {
                assert_eq!(e.file, file, "{e}");
                assert!(!e.problem.is_empty(), "{e}");
                assert!(e.line <= lines, "line {} of {lines}: {e}", e.line);
                assert!(e.line == 0 || e.column >= 1, "{e}");
                assert!(errors.to_string().contains(&e.problem));
            }
            return;
        }
    };
    let again = Config::parse_offline(file, text).expect("accepted once, accepted again");
    assert_eq!(config.content_hash, again.content_hash);
    let first = Snapshot::of(Arc::new(config));
    let second = Snapshot::of(Arc::new(again));
    match (first, second) {
        (Ok(a), Ok(b)) => assert_eq!(a.fingerprint, b.fingerprint),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("built once, not twice: {:?} / {:?}", a.is_ok(), b.is_ok()),
    }
}
