//! The web dashboard at `/ui`: static HTML, CSS and JavaScript modules
//! compiled into the binary, so a node with no internet serves the whole
//! dashboard and the version of the page always matches the API it calls.
//!
//! The assets hold no data and no secret: they are served without the
//! admin token, so a browser off loopback can load the page that asks for
//! it. Every call the page then makes goes to `/api/v1` with the token, and
//! the API's own check decides (see `authenticate` in `api/mod.rs`).
//!
//! The page routes with the URL's fragment (`/ui/#/volumes/NAME`), so the
//! server only knows the asset paths; any other path under `/ui` is a 404
//! page that links back to the dashboard.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// One embedded file: its path under `/ui/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! asset {
    ($path:literal, $content_type:expr) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_str!(concat!("../../ui/", $path)),
        }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Every file of `crates/node/ui` (a unit test checks none is left out).
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/app.js", JAVASCRIPT),
    asset!("js/api.js", JAVASCRIPT),
    asset!("js/dom.js", JAVASCRIPT),
    asset!("js/chart.js", JAVASCRIPT),
    asset!("js/dialogs.js", JAVASCRIPT),
    asset!("js/history.js", JAVASCRIPT),
    asset!("js/nodes.js", JAVASCRIPT),
    asset!("js/pages.js", JAVASCRIPT),
    asset!("js/snapshots.js", JAVASCRIPT),
    asset!("js/space.js", JAVASCRIPT),
    asset!("js/volumes.js", JAVASCRIPT),
    asset!("js/widgets.js", JAVASCRIPT),
    asset!("not-found.html", HTML),
];

/// Scripts only from the node itself, no inline script or style: a volume
/// or node name shown in the page can never become code. No framing, so
/// another site cannot overlay the action buttons.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'; form-action 'none'";

/// The routes of the dashboard; merged into the API's router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/{*path}", get(asset))
}

async fn index() -> Response {
    serve("index.html").unwrap_or_else(|| not_found("/ui/"))
}

async fn asset(Path(path): Path<String>) -> Response {
    serve(&path).unwrap_or_else(|| not_found(&format!("/ui/{path}")))
}

fn serve(path: &str) -> Option<Response> {
    let asset = ASSETS.iter().find(|asset| asset.path == path)?;
    Some(respond(StatusCode::OK, asset.content_type, asset.body))
}

/// The dashboard's 404 page, as HTML: people reach it from a browser.
fn not_found(path: &str) -> Response {
    let page = ASSETS
        .iter()
        .find(|asset| asset.path == "not-found.html")
        .map(|asset| asset.body)
        .unwrap_or("<!doctype html><title>Not found</title><p>No such page.</p>");
    // The path is shown escaped: it is whatever the browser asked for.
    let page = page.replace("{{path}}", &escape_html(path));
    let mut response = respond(StatusCode::NOT_FOUND, HTML, "");
    *response.body_mut() = page.into();
    response
}

fn respond(status: StatusCode, content_type: &'static str, body: &'static str) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A node upgraded in place serves new assets at the same paths.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn escape_html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_path(path: &str) -> (StatusCode, String, String) {
        let response = router::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    fn ui_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui")
    }

    fn files_under(dir: &std::path::Path, prefix: &str, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                files_under(&entry.path(), &format!("{name}/"), found);
            } else {
                found.push(name);
            }
        }
    }

    #[test]
    fn every_file_of_the_ui_directory_is_embedded() {
        let mut on_disk = Vec::new();
        files_under(&ui_dir(), "", &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        embedded.sort();
        assert_eq!(
            on_disk, embedded,
            "ASSETS in api/ui.rs and crates/node/ui differ"
        );
    }

    /// A module imported but not embedded would load as the 404 page and
    /// break the whole dashboard in the browser only.
    #[test]
    fn every_module_import_names_an_embedded_file() {
        for asset in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            for line in asset.body.lines() {
                let line = line.trim();
                if !line.starts_with("import ") {
                    continue;
                }
                let target = line
                    .rsplit(['"', '\''])
                    .nth(1)
                    .unwrap_or_else(|| panic!("{}: cannot read {line}", asset.path));
                let target = target.strip_prefix("./").expect("relative imports only");
                let full = format!("js/{target}");
                assert!(
                    ASSETS.iter().any(|a| a.path == full),
                    "{} imports {target}, which is not embedded",
                    asset.path
                );
            }
        }
    }

    #[tokio::test]
    async fn the_page_and_its_assets_are_served_with_their_types() {
        for path in ["/ui", "/ui/", "/ui/index.html"] {
            let (status, content_type, body) = get_path(path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(content_type, HTML);
            assert!(body.contains("/ui/js/app.js"), "{path}: {body}");
        }
        let (status, content_type, _) = get_path("/ui/js/app.js").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, JAVASCRIPT);
    }

    #[tokio::test]
    async fn an_unknown_path_is_a_404_page_that_names_it_escaped() {
        for path in ["/ui/nope", "/ui/js/missing.js", "/ui/../api/v1/status"] {
            let (status, content_type, body) = get_path(path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(content_type, HTML, "{path}");
            assert!(body.contains("href=\"/ui/\""), "{path}: {body}");
        }
        let (_, _, body) = get_path("/ui/%3Cscript%3Ex").await;
        assert!(body.contains("&lt;script&gt;x"), "{body}");
        assert!(!body.contains("<script>x"), "{body}");
    }
}
