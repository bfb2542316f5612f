//! The grammar of an image reference (`[host[:port]/]path[:tag][@sha256:digest]`), as
//! Docker's `distribution/reference` reads it: a task's `Image` and a pod's services' `image`
//! are both checked by it, so it is apart from either.

/// Docker's longest image name (the repository, without tag or digest).
pub const MAX_IMAGE_NAME_CHARS: usize = 255;

/// Checks an image reference roughly as Docker's grammar (`distribution/reference`) does:
/// `[host[:port]/]path[:tag][@sha256:digest]`, where each path component is lowercase letters
/// and digits separated by `.`, `_`, `__` or dashes, the name (host and path) is at most
/// [`MAX_IMAGE_NAME_CHARS`], and a tag is 1-128 of letters, digits, `_`, `.` and `-`, not
/// starting with `.` or `-`. The first component is a host when it has a `.` or `:` or is
/// `localhost`. Newer Docker clients also read a first component with a capital letter
/// (`UPPER/case`) as a host, but the daemon Cube runs on (20.10) reads it as a repository and
/// refuses it ("repository name must be lowercase"), so Cube refuses it at submission too. A
/// tag may hold capitals (`app:V1`); only the repository path may not.
pub fn check_image_reference(image: &str) -> Result<(), String> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let valid = digest.strip_prefix("sha256:").is_some_and(|hex| {
            hex.len() == 64 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        });
        if !valid {
            return Err(format!(
                "the digest {digest:?} is not \"sha256:\" and 64 lowercase hex digits"
            ));
        }
    }
    let after_last_slash = rest.rfind('/').map_or(0, |slash| slash + 1);
    let (name, tag) = match rest[after_last_slash..].rfind(':') {
        Some(colon) => {
            let colon = after_last_slash + colon;
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !(first_ok && rest_ok && tag.len() <= 128) {
            return Err(format!(
                "the tag {tag:?} is not 1-128 letters, digits, '_', '.' or '-' \
                 (not starting with '.' or '-')"
            ));
        }
    }
    if name.is_empty() {
        return Err("there is no repository name".to_string());
    }
    let name_chars = name.chars().count();
    if name_chars > MAX_IMAGE_NAME_CHARS {
        return Err(format!(
            "the name is {name_chars} characters; the limit is {MAX_IMAGE_NAME_CHARS}"
        ));
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        let is_host = first.contains(['.', ':']) || first == "localhost";
        if is_host {
            check_registry_host(first)?;
            components.remove(0);
        }
    }
    for component in components {
        if !is_path_component(component) {
            if is_path_component(&component.to_ascii_lowercase()) {
                return Err(format!(
                    "repository names must be lowercase ({component:?})"
                ));
            }
            return Err(format!(
                "{component:?} is not a name component: lowercase letters and digits, \
                 separated by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !(bytes.first().is_some_and(|b| alphanumeric(*b))
        && bytes.last().is_some_and(|b| alphanumeric(*b)))
    {
        return false;
    }
    let mut index = 0;
    while index < bytes.len() {
        if alphanumeric(bytes[index]) {
            index += 1;
            continue;
        }
        let start = index;
        while index < bytes.len() && !alphanumeric(bytes[index]) {
            index += 1;
        }
        let separator = &component[start..index];
        let valid = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !valid {
            return false;
        }
    }
    true
}

/// `host[:port]`: DNS labels of letters, digits and inner dashes separated by dots (or an
/// IPv6 address in brackets), and an optional port number.
fn check_registry_host(host: &str) -> Result<(), String> {
    let (name, port) = if let Some(end) = host.strip_prefix('[').and_then(|h| h.find(']')) {
        let address = &host[1..=end];
        let after = &host[end + 2..];
        let port = after.strip_prefix(':');
        if !address.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
            || !(after.is_empty() || port.is_some())
        {
            return Err(format!("{host:?} is not a registry host[:port]"));
        }
        (None, port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        }
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let name_ok = name.is_none_or(|name| name.split('.').all(label_ok));
    let port_ok =
        port.is_none_or(|port| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()));
    if name_ok && port_ok {
        Ok(())
    } else {
        Err(format!("{host:?} is not a registry host[:port]"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_follow_dockers_grammar() {
        for valid in [
            "busybox",
            "x",
            "0x10",
            "cube-sample:latest",
            "timboring/echo-server:latest",
            "library/busybox:1.36.1-musl",
            "127.0.0.1:9/cube/missing:1",
            "localhost/app",
            "registry.example.com:5000/team/app_v2__x:v1",
            "Registry.Example.com/app",
            "UPPER:5000/app",
            "app:V1",
            "team/app:Release-2",
            "[::1]:5000/app",
            "my--image",
            "busybox@sha256:3fbc632167424a6d997e74f52b878d7cc478225cffac6bc977eedfe51c7f4e79",
            "busybox:1@sha256:3fbc632167424a6d997e74f52b878d7cc478225cffac6bc977eedfe51c7f4e79",
        ] {
            assert_eq!(check_image_reference(valid), Ok(()), "{valid}");
        }
        for (invalid, why) in [
            ("Running", "must be lowercase"),
            ("team/App", "must be lowercase"),
            ("UPPER/case:tag", "must be lowercase (\"UPPER\")"),
            ("Team/app", "must be lowercase"),
            ("LOCALHOST/app", "must be lowercase"),
            (&"x".repeat(300), "the limit is 255"),
            ("busy box", "not a name component"),
            ("a..b", "not a name component"),
            ("-a", "not a name component"),
            ("a/", "not a name component"),
            ("busybox:", "the tag"),
            ("busybox:.x", "the tag"),
            (&format!("busybox:{}", "t".repeat(129)), "the tag"),
            ("busybox@sha256:abc", "the digest"),
            (":latest", "no repository name"),
            ("a\u{0}b", "not a name component"),
            ("bad_host:port/x", "not a registry host"),
        ] {
            let err = check_image_reference(invalid).expect_err(invalid);
            assert!(err.contains(why), "{invalid}: {err}");
        }
    }
}
