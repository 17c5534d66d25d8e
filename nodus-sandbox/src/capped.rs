//! Output capping shared by every backend: the first bytes of a stream up to a cap, and
//! whether more came.

use nodus_core::output::Output;

/// Appends what fits of `chunk` to `out` (at most `cap` bytes in all) and marks `out`
/// truncated when some of it did not fit. Bytes are kept exactly; nothing is decoded.
pub(crate) fn push(out: &mut Output, cap: usize, chunk: &[u8]) {
    let room = cap.saturating_sub(out.bytes.len());
    let keep = chunk.get(..room).unwrap_or(chunk);
    out.bytes.extend_from_slice(keep);
    if keep.len() < chunk.len() {
        out.truncated = true;
    }
}

/// A cap in bytes as a length, saturating on 32-bit targets.
pub(crate) fn cap_len(cap: u64) -> usize {
    usize::try_from(cap).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_marks_the_cut() {
        let mut out = Output::default();
        push(&mut out, 5, b"abc");
        assert_eq!((out.bytes.as_slice(), out.truncated), (&b"abc"[..], false));
        push(&mut out, 5, b"de");
        assert_eq!(
            (out.bytes.as_slice(), out.truncated),
            (&b"abcde"[..], false)
        );
        push(&mut out, 5, b"");
        assert!(!out.truncated, "an empty chunk cuts nothing");
        push(&mut out, 5, b"f");
        assert_eq!((out.bytes.as_slice(), out.truncated), (&b"abcde"[..], true));

        let mut zero = Output::default();
        push(&mut zero, 0, b"x");
        assert!(zero.bytes.is_empty() && zero.truncated);
    }
}
