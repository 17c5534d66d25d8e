//! Answers that hand a file to the caller (a run's result, for the API and the console
//! alike), and the percent-encoding their file names and the console's URLs use.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A result as a download (the API's route and the console's): its content type, and its
/// file name with every byte but `[A-Za-z0-9._~-]` percent-encoded, so that a name an action
/// chose can neither break the header nor add a parameter to it.
pub(crate) fn result_download(found: nodus_core::engine::RunResult) -> Response {
    let file_name = percent_encode(&found.info.file_name);
    (
        StatusCode::OK,
        [
            (axum::http::header::CONTENT_TYPE, found.info.content_type),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file_name}\""),
            ),
        ],
        found.content,
    )
        .into_response()
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`: safe in a path
/// segment, a query value and an HTML attribute.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}
