//! How the kubelet (Go) renders values in the error texts a plugin receives
//! in `NotifyRegistrationStatus` and a log reader sees: `%q`, `%v` of string
//! slices, grpc-go's code names. The handlers use these so that kpm's
//! reasons read like the kubelet's.

use std::fmt::Write as _;

/// Go's `%q` of a string (`strconv.Quote`): double quotes, backslash escapes
/// for quotes, backslashes and control characters.
pub fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
pub fn go_quote_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| go_quote(item)).collect();
    format!("[{}]", quoted.join(" "))
}

/// Go's `%v` of a `[]string`: `[a b]`.
pub fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// The name grpc-go gives a status code (`codes.Code.String()`).
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// An error and its sources, joined with `: `, skipping a source whose text
/// the previous one already contains (tonic's transport error says only
/// "transport error"; the reason is in its sources).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_escapes_like_strconv_quote() {
        assert_eq!(go_quote("vendor.com/gpu"), "\"vendor.com/gpu\"");
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("tab\there\nnl\x01\x7f"), "\"tab\\there\\nnl\\x01\\x7f\"");
        assert_eq!(go_quote("zone-ä"), "\"zone-ä\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
    }

    #[test]
    fn go_lists_print_like_fmt() {
        let versions = vec!["v0.3.0".to_owned(), "2.0.1".to_owned()];
        assert_eq!(go_list(&versions), "[v0.3.0 2.0.1]");
        assert_eq!(go_quote_list(&versions), "[\"v0.3.0\" \"2.0.1\"]");
        assert_eq!(go_list(&[]), "[]");
    }

    #[test]
    fn code_names_are_grpc_gos() {
        assert_eq!(go_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(tonic::Code::DeadlineExceeded), "DeadlineExceeded");
    }

    #[test]
    fn error_chain_appends_causes_it_does_not_already_show() {
        #[derive(Debug)]
        struct Wrapper(&'static str, std::io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.1)
            }
        }
        let gone = || std::io::Error::other("socket gone");
        assert_eq!(
            error_chain(&Wrapper("transport error", gone())),
            "transport error: socket gone"
        );
        assert_eq!(error_chain(&Wrapper("dial: socket gone", gone())), "dial: socket gone");
    }
}
