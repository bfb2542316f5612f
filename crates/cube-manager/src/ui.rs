//! The web UI, `GET /ui`: one page and its script and style, built into the binary
//! (`include_str!` of `ui/`), nothing fetched from anywhere else. The page holds no data: it
//! reads the API as any client does, with the token the person entered (kept in the
//! browser's session storage, sent as `Authorization: Bearer`, never in a URL), so the
//! assets are open (`acl::ROUTES`) and every answer they lead to is checked as the CLI's are.
//!
//! What the page shows is loaded once, then kept up to date from `GET /events` (a stream,
//! never a poll on a timer); a broken stream is shown and resumed from its last index.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cube_api::ApiError;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// The page may run only its own script and style, and talk only to its own origin.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

fn asset_response(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The assets change with the binary: a browser asks again rather than keep an old one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /ui`: the page.
pub async fn index() -> Response {
    asset_response("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{asset}`: `app.js` or `app.css`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => asset_response("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => asset_response("text/css; charset=utf-8", STYLE),
        _ => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the UI has no file {name:?} (it has /ui, /ui/app.js and /ui/app.css)"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        assert!(INDEX.contains(r#"src="/ui/app.js""#));
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
        for outside in ["http://", "https://", "//cdn"] {
            assert!(!INDEX.contains(outside), "the page names {outside}");
            assert!(!SCRIPT.contains(outside), "the script names {outside}");
        }
    }
}
