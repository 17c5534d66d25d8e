//! Checks of names and paths that come from outside: sandbox keys, and paths relative to a
//! working directory.

use std::path::{Component, Path, PathBuf};

/// The longest key: a file name may have at most 255 bytes on common file systems.
const MAX_KEY_LEN: usize = 255;

/// Checks that `key` can be used as one path component: non-empty, at most 255 bytes, only
/// `[A-Za-z0-9._-]`, and neither `.` nor `..`. Returns the reason when it cannot.
pub(crate) fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("sandbox key must not be empty".to_owned());
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "sandbox key must have at most {MAX_KEY_LEN} bytes, not {}",
            key.len()
        ));
    }
    if key == "." || key == ".." {
        return Err(format!("sandbox key {key:?} is not a name"));
    }
    if let Some(bad) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "sandbox key {key:?} may only contain ASCII letters, digits, '.', '_' and '-', not {bad:?}"
        ));
    }
    Ok(())
}

/// Parses a path that must stay under a directory: relative, without `..`. Returns it with
/// `.` components and repeated or trailing slashes dropped; the empty path means the directory
/// itself. Returns the reason when the path is refused.
pub(crate) fn relative(path: &Path) -> Result<PathBuf, &'static str> {
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err("contains a NUL byte");
    }
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => return Err("is absolute"),
            Component::ParentDir => return Err("contains `..`"),
            Component::CurDir => {}
            Component::Normal(name) => clean.push(name),
        }
    }
    Ok(clean)
}

/// The proper ancestors of a relative path, shortest first, without the empty path:
/// `a/b/c` gives `a` and `a/b`.
pub(crate) fn ancestors(path: &Path) -> impl Iterator<Item = &Path> {
    let mut all: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .collect();
    all.reverse();
    all.into_iter()
}

/// An I/O error as a user may see it: its message and the messages of its causes (a tar
/// error names its file but not why it failed), with `dir` (the working directory, as given
/// or canonical) shown as `.`, so that no host path reaches a run's status or an API answer.
pub(crate) fn shown_error(e: &std::io::Error, dir: &Path) -> String {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = inner.source();
    }
    let mut forms = vec![dir.to_path_buf()];
    if let Ok(canonical) = dir.canonicalize() {
        forms.push(canonical);
    }
    for form in forms {
        let form = form.display().to_string();
        if !form.is_empty() && form != "/" {
            message = message
                .replace(&format!("{form}/"), "./")
                .replace(&form, ".");
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for good in ["run-1", "a", "A.b_c-9", "..x", "x.."] {
            assert_eq!(check_key(good), Ok(()), "{good}");
        }
        let long = "k".repeat(256);
        for bad in ["", ".", "..", "a/b", "/a", "a b", "ü", "a\0", long.as_str()] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relative_paths() {
        let ok = |p: &str| relative(Path::new(p)).map(|p| p.to_string_lossy().into_owned());
        assert_eq!(ok(""), Ok(String::new()));
        assert_eq!(ok("."), Ok(String::new()));
        assert_eq!(ok("./a//b/"), Ok("a/b".to_owned()));
        assert_eq!(ok("a/./b"), Ok("a/b".to_owned()));
        assert_eq!(ok("/etc"), Err("is absolute"));
        assert_eq!(ok("a/../b"), Err("contains `..`"));
        assert_eq!(ok(".."), Err("contains `..`"));
        assert_eq!(ok("a\0b"), Err("contains a NUL byte"));
    }

    #[test]
    fn ancestors_shortest_first() {
        let got: Vec<_> = ancestors(Path::new("a/b/c")).collect();
        assert_eq!(got, [Path::new("a"), Path::new("a/b")]);
        assert_eq!(ancestors(Path::new("a")).count(), 0);
    }
}
