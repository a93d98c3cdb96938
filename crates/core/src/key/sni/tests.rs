use super::testing::{client_hello, client_hello_in, in_records};
use super::*;

const LIMIT: usize = 16 << 10;

fn found(name: &str) -> HelloScan {
    HelloScan::Found(server_name_key(name.as_bytes()))
}

#[test]
fn a_rustls_hello_gives_its_server_name() {
    let hello = client_hello("api.example.com");
    assert_eq!(scan_client_hello(&hello, LIMIT), found("api.example.com"));
    // Bytes after the hello (what a client sends next) change nothing.
    let mut more = hello.clone();
    more.extend_from_slice(b"\x14\x03\x03\x00\x01\x01");
    assert_eq!(scan_client_hello(&more, LIMIT), found("api.example.com"));
}

#[test]
fn the_key_ignores_case_and_a_trailing_dot() {
    let key = server_name_key(b"api.example.com");
    assert_eq!(server_name_key(b"API.Example.COM"), key);
    assert_eq!(server_name_key(b"api.example.com."), key);
    assert_ne!(server_name_key(b"api.example.org"), key);
    // The name as the hello carries it, upper-cased on the wire.
    let mut hello = client_hello("api.example.com");
    let at = hello
        .windows(3)
        .position(|w| w == b"api")
        .expect("the name in the hello");
    hello[at..at + 3].copy_from_slice(b"API");
    assert_eq!(scan_client_hello(&hello, LIMIT), HelloScan::Found(key));
}

#[test]
fn every_prefix_needs_more_and_says_how_much() {
    let hello = client_hello("a.example");
    for len in 0..hello.len() {
        match scan_client_hello(&hello[..len], LIMIT) {
            HelloScan::NeedMore(n) => {
                assert!(n > len && n <= hello.len(), "prefix {len}: needs {n}")
            }
            other => panic!("prefix {len}: {other:?}"),
        }
    }
}

#[test]
fn a_hello_split_over_records_and_reads_gives_the_same_key() {
    let hello = client_hello("split.example.net");
    for size in [1, 2, 3, 4, 5, 7, 64, 100, 511] {
        let framed = in_records(&hello, size);
        assert_eq!(
            scan_client_hello(&framed, LIMIT),
            found("split.example.net"),
            "records of {size}"
        );
        // Resumed after any first part, and after every byte.
        for split in 0..framed.len() {
            let mut scanner = HelloScanner::new(LIMIT);
            let _ = scanner.scan(&framed[..split]);
            assert_eq!(scanner.scan(&framed), found("split.example.net"));
        }
        let mut scanner = HelloScanner::new(LIMIT);
        for len in 0..framed.len() {
            assert!(matches!(
                scanner.scan(&framed[..len]),
                HelloScan::NeedMore(_)
            ));
        }
        assert_eq!(scanner.scan(&framed), found("split.example.net"));
    }
}

#[test]
fn a_hello_rustls_splits_over_records_gives_its_name() {
    let hello = client_hello_in("frag.example", Some(64));
    let whole = client_hello("frag.example");
    let records = (hello.len() - whole.len()) / RECORD_HEADER + 1;
    assert!(records >= 3, "{} bytes, {} whole", hello.len(), whole.len());
    assert_eq!(scan_client_hello(&hello, LIMIT), found("frag.example"));
}

#[test]
fn a_hello_without_a_name_falls_back() {
    let hello = client_hello("192.0.2.7");
    assert_eq!(
        scan_client_hello(&hello, LIMIT),
        HelloScan::Fallback(FallbackReason::NoSni)
    );
}

#[test]
fn other_bytes_are_refused_from_their_first_byte() {
    let not_tls = HelloScan::Fallback(FallbackReason::NotTls);
    assert_eq!(scan_client_hello(b"G", LIMIT), not_tls);
    assert_eq!(scan_client_hello(b"SSH-2.0-x\r\n", LIMIT), not_tls);
    // An alert record, a handshake record of TLS "2.0", an empty record.
    assert_eq!(scan_client_hello(b"\x15\x03\x03\x00\x02", LIMIT), not_tls);
    assert_eq!(scan_client_hello(b"\x16\x02", LIMIT), not_tls);
    assert_eq!(scan_client_hello(b"\x16\x03\x01\x00\x00", LIMIT), not_tls);
    // A record longer than TLS allows.
    assert_eq!(scan_client_hello(b"\x16\x03\x01\x48\x01", LIMIT), not_tls);
    // A handshake that is not a ClientHello (a ServerHello).
    assert_eq!(
        scan_client_hello(b"\x16\x03\x03\x00\x30\x02", LIMIT),
        not_tls
    );
    // The start of a hello, then a record of another type.
    let hello = in_records(&client_hello("x.example"), 100);
    let mut mixed = hello[..105].to_vec();
    mixed.extend_from_slice(b"\x17\x03\x03\x00\x10");
    assert_eq!(scan_client_hello(&mixed, LIMIT), not_tls);
}

#[test]
fn a_malformed_hello_is_not_tls() {
    let mut hello = client_hello("bad.example");
    // The extensions' length (the body's last length field before them)
    // made larger than what follows: the hello no longer parses whole.
    let body = &hello[RECORD_HEADER + HANDSHAKE_HEADER..];
    let sid = usize::from(body[34]);
    let ciphers = usize::from(u16::from_be_bytes([body[35 + sid], body[36 + sid]]));
    let comp_at = 37 + sid + ciphers;
    let ext_at = RECORD_HEADER + HANDSHAKE_HEADER + comp_at + 1 + usize::from(body[comp_at]);
    hello[ext_at] = 0xff;
    assert_eq!(
        scan_client_hello(&hello, LIMIT),
        HelloScan::Fallback(FallbackReason::NotTls)
    );
}

#[test]
fn a_hello_past_the_limit_is_too_large_as_soon_as_its_length_says_so() {
    let hello = client_hello("big.example");
    let too_large = HelloScan::Fallback(FallbackReason::TooLarge);
    // Record and handshake headers are 9 bytes: the length is known there.
    assert_eq!(scan_client_hello(&hello[..9], 64), too_large);
    assert_eq!(scan_client_hello(&hello, 64), too_large);
    assert_eq!(scan_client_hello(&hello, hello.len()), found("big.example"));
    assert_eq!(scan_client_hello(&hello, hello.len() - 1), too_large);
    // Split in small records, the headers take room too.
    let framed = in_records(&hello, 16);
    assert_eq!(scan_client_hello(&framed, hello.len()), too_large);
    assert_eq!(
        scan_client_hello(&framed, framed.len()),
        found("big.example")
    );
}
