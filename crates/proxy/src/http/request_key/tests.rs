use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

#[test]
fn json_content_types() {
    for yes in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/vnd.api+json",
    ] {
        assert!(is_json(yes.as_bytes()), "{yes}");
    }
    for no in ["text/plain", "application/jsonx", "multipart/form-data"] {
        assert!(!is_json(no.as_bytes()), "{no}");
    }
}

#[test]
fn blank_headers_are_absent() {
    let h = headers(&[("x-session-id", "  "), ("x-other", "a")]);
    assert_eq!(header_value(&h, "x-session-id"), None);
    assert_eq!(header_value(&h, "x-other"), Some(&b"a"[..]));
}

#[test]
fn a_body_read_for_its_group_also_gives_its_system_head() {
    let sources = KeySources {
        from: "header",
        header: Some("x-session-id"),
        body_field: None,
        conversation: false,
        server_name: false,
    };
    let body = |user: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"{user}"}}]}}"#
        )
    };
    let read = |by: &GroupBy, user: &str| {
        let wants = Wants {
            session: false,
            group: Some(by),
            system_head: true,
        };
        body_keys(&sources, wants, body(user).as_bytes())
    };
    // Two conversations that open differently: two groups, one system head.
    let (a, b) = (
        read(&GroupBy::Conversation, "hi"),
        read(&GroupBy::Conversation, "yo"),
    );
    assert_ne!(a.group, b.group);
    let system = a.heads.system.expect("a system head");
    assert_eq!(b.heads.system, Some(system));
    assert!(system.1 > 0 && a.heads.group_bytes > 0);
    // Grouped by the system head, the group is it: no second one.
    let c = read(&GroupBy::System, "hi");
    assert_eq!(c.group, Some(Ok(system.0)));
    assert_eq!((c.heads.group_bytes, c.heads.system), (system.1, None));
}
