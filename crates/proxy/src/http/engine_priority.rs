//! The engine's priority in a request body. Under `queue.priority.engine`,
//! a request whose body is one JSON object, read whole for its keys, goes
//! on with the top-level field `priority` set to its class's value: engines
//! that schedule by priority (vLLM with `--scheduling-policy priority`,
//! SGLang with `--enable-priority-scheduling`, `magpie engine --priority`)
//! then put it ahead of a lower class already queued inside them. A
//! `priority` the client wrote is replaced: the class is magpie's to say.
//! The other fields pass as they came, byte for byte (the whitespace between
//! them is dropped).

use super::body_fields;

/// The body field engines read a request's priority from.
const FIELD: &str = "priority";

/// `body` with its top-level `priority` set to `value`; `None` when the
/// body is not one JSON object (it then goes on unchanged).
pub(crate) fn with_priority(body: &[u8], value: i64) -> Option<Vec<u8>> {
    body_fields::edit(body, &[], &[(FIELD, &value.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(body: &str, value: i64) -> Option<serde_json::Value> {
        let out = with_priority(body.as_bytes(), value)?;
        Some(serde_json::from_slice(&out).expect("the body stays JSON"))
    }

    #[test]
    fn the_class_value_is_added_and_every_field_kept() {
        let body =
            r#"{"model":"m","messages":[{"role":"user","content":"hi \"x\" }"}],"stream":true}"#;
        let out = String::from_utf8(with_priority(body.as_bytes(), -3).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"model":"m","messages":[{"role":"user","content":"hi \"x\" }"}],"stream":true,"priority":-3}"#
        );
        assert_eq!(written("{}", 7), Some(serde_json::json!({"priority": 7})));
        assert_eq!(
            written(" {\n \"a\\u0041\" : 1 }\n", 0),
            Some(serde_json::json!({"aA": 1, "priority": 0}))
        );
    }

    #[test]
    fn a_priority_the_client_wrote_is_replaced() {
        let out = with_priority(br#"{"priority":-100,"a":1,"priority":5}"#, 10).unwrap();
        assert_eq!(out, br#"{"a":1,"priority":10}"#);
    }
}
