//! Kubernetes name syntax: qualified names (label keys, resource names) and DNS-1123 subdomains.

/// Whether `value` is a qualified name (`[prefix/]name`, label keys and resource names): a name
/// of 1 to 63 characters of `[A-Za-z0-9_.-]` starting and ending with an alphanumeric, after an
/// optional non-empty DNS-1123 subdomain prefix.
pub fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(is_dns1123_subdomain)
}

/// Whether `value` is a DNS-1123 subdomain: at most 253 characters, dot-separated non-empty
/// labels of `[a-z0-9-]` that start and end with an alphanumeric.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && label.bytes().next().is_some_and(|b| b != b'-')
                && label.bytes().last().is_some_and(|b| b != b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_and_subdomains() {
        for ok in [
            "a",
            "app.kubernetes.io/name",
            "example.com/A_b-c.d",
            "x/y",
            &"a".repeat(63),
        ] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "a b",
            "Example.com/a",
            &"a".repeat(64),
            "ex_ample.com/a",
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }
}
