//! The rules of a FileSet and of paths inside a working directory (FileSet files and
//! artifact mounts alike).

use super::{Invalid, Result, Validate, shown};
use crate::resource::FileSetSpec;

/// The longest component of a path in a working directory, in bytes (what file systems take).
pub const MAX_PATH_COMPONENT_BYTES: usize = 255;
/// The most files one FileSet holds.
pub const MAX_FILESET_FILES: usize = 10_000;

impl Validate for FileSetSpec {
    fn check_spec(&self) -> Result<()> {
        if self.files.len() > MAX_FILESET_FILES {
            return Err(Invalid::new(
                "spec.files",
                format!("must hold at most {MAX_FILESET_FILES} files"),
                self.files.len().to_string(),
            ));
        }
        let mut paths = Vec::with_capacity(self.files.len());
        for (index, file) in self.files.iter().enumerate() {
            let field = format!("spec.files[{index}].path");
            paths.push((check_mount_path(&field, &file.path)?, index));
            if let Some(encoded) = &file.content_base64 {
                let field = format!("spec.files[{index}].contentBase64");
                if !file.content.is_empty() {
                    return Err(Invalid::new(
                        field,
                        "must not be given with content: a file has one or the other",
                        shown(encoded),
                    ));
                }
                if let Err(e) = file.bytes() {
                    return Err(Invalid::new(
                        field,
                        format!("must be standard base64 ({e})"),
                        shown(encoded),
                    ));
                }
            }
        }
        check_no_overlap(paths, &|index| {
            let path = self.files.get(index).map_or("", |f| f.path.as_str());
            (format!("spec.files[{index}].path"), path)
        })
    }
}

/// No path (its components, with its index) is another's, or inside another's; `describe`
/// gives an index's field and path for the error, which names the later of the two.
pub(super) fn check_no_overlap<'a>(
    mut paths: Vec<(Vec<&str>, usize)>,
    describe: &dyn Fn(usize) -> (String, &'a str),
) -> Result<()> {
    // Sorted component-wise, a path that contains another comes right after one that it
    // contains, so comparing neighbours finds every overlap.
    paths.sort();
    for pair in paths.windows(2) {
        if let [(first, first_index), (second, second_index)] = pair
            && second.starts_with(first)
        {
            let (earlier, later) = if first_index < second_index {
                (*first_index, *second_index)
            } else {
                (*second_index, *first_index)
            };
            let (earlier_field, earlier_path) = describe(earlier);
            let (later_field, later_path) = describe(later);
            return Err(Invalid::new(
                later_field,
                format!("must not overlap {earlier_field} ({})", shown(earlier_path)),
                shown(later_path),
            ));
        }
    }
    Ok(())
}

/// A relative path inside the working directory; returns its components.
pub(super) fn check_mount_path<'a>(field: &str, path: &'a str) -> Result<Vec<&'a str>> {
    if path.is_empty() {
        return Err(Invalid::new(field, "must not be empty", shown(path)));
    }
    if path.contains('\0') {
        return Err(Invalid::new(field, "must not contain NUL", shown(path)));
    }
    if path.contains(char::is_control) {
        return Err(Invalid::new(
            field,
            "must not contain control characters",
            shown(path),
        ));
    }
    if path.contains(is_bidi_control) {
        return Err(Invalid::new(
            field,
            "must not contain bidirectional overrides or isolates (U+202A to U+202E, \
             U+2066 to U+2069)",
            shown(path),
        ));
    }
    if path.starts_with('/') {
        return Err(Invalid::new(
            field,
            "must be relative to the working directory",
            shown(path),
        ));
    }
    let components: Vec<&str> = path
        .split('/')
        .filter(|component| !component.is_empty() && *component != ".")
        .collect();
    if components.contains(&"..") {
        return Err(Invalid::new(
            field,
            "must not contain `..` components",
            shown(path),
        ));
    }
    if components.is_empty() {
        return Err(Invalid::new(
            field,
            "must name a file inside the working directory",
            shown(path),
        ));
    }
    if components
        .iter()
        .any(|component| component.starts_with('-'))
    {
        return Err(Invalid::new(
            field,
            "must not have a component that starts with `-` (a command would read it as an \
             option)",
            shown(path),
        ));
    }
    if let Some(long) = components
        .iter()
        .find(|component| component.len() > MAX_PATH_COMPONENT_BYTES)
    {
        return Err(Invalid::new(
            field,
            format!(
                "must not have a component longer than {MAX_PATH_COMPONENT_BYTES} bytes (one \
                 has {})",
                long.len()
            ),
            shown(path),
        ));
    }
    Ok(components)
}

/// Characters that reorder how text is displayed (bidirectional embeddings, overrides and
/// isolates), so that a path would look like another one.
pub(super) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
#[path = "fileset_tests.rs"]
mod tests;
