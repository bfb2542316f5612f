//! A real browser for the web UI's tests: Debian's headless Chromium, driven through
//! `chromedriver` over the W3C WebDriver protocol (plain JSON over HTTP on loopback), so a
//! test clicks, types and reads the page as a person would. `chromedriver` runs on a free
//! port for the test and is killed on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a wait for the page (`Browser::wait_for`) may take before the test fails.
pub const PAGE_WAIT: Duration = Duration::from_secs(30);

/// One Chromium session, headless, at 1280×800.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

fn binary(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/lib/chromium"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!(
        "{name} is not installed: the web UI's tests need Debian's chromium and chromium-driver \
         (`apt-get install -y chromium chromium-driver`; scripts/setup.sh installs them)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session of 1280×800.
    pub async fn start() -> Browser {
        Browser::start_with(false).await
    }

    /// [`Browser::start`], the browser taking any server certificate: for a manager with
    /// `--tls`, whose certificate comes from the cluster's own CA, which a person's browser
    /// would be told to trust once.
    pub async fn start_accepting_any_certificate() -> Browser {
        Browser::start_with(true).await
    }

    async fn start_with(accept_any_certificate: bool) -> Browser {
        let chromium = binary("chromium");
        let driver_path = binary("chromedriver");
        let spawn = |port: u16| {
            Command::new(&driver_path)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts")
        };
        let mut port = free_port();
        let mut driver = spawn(port);
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        let started = Instant::now();
        loop {
            let ready = http
                .get(format!("http://127.0.0.1:{port}/status"))
                .send()
                .await;
            if let Ok(response) = ready
                && let Ok(status) = response.json::<Value>().await
                && status["value"]["ready"] == json!(true)
            {
                break;
            }
            // The free port was taken by another process of the tests before chromedriver
            // bound it (it then exits): started again on another.
            if matches!(driver.try_wait(), Ok(Some(_))) {
                port = free_port();
                driver = spawn(port);
            }
            assert!(
                started.elapsed() < PAGE_WAIT,
                "chromedriver did not get ready on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let base = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir().expect("a profile directory");
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "acceptInsecureCerts": accept_any_certificate,
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--no-first-run",
                            "--window-size=1280,800",
                            format!("--user-data-dir={}", profile.path().display()),
                        ],
                    },
                },
            },
        });
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("a JSON answer");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no Chromium session: {answer}"))
            .to_string();
        let browser = Browser {
            driver,
            base,
            session,
            http,
            _profile: profile,
        };
        browser.set_size(1280, 800).await;
        browser
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.try_call(method.clone(), path, body)
            .await
            .unwrap_or_else(|error| panic!("{method} {path}: {error}"))
    }

    /// A WebDriver command; its error (`stale element reference: ...`) as a value.
    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .unwrap_or_else(|err| panic!("{method} {path}: {err}"))
            .json()
            .await
            .unwrap_or_else(|err| panic!("{method} {path}: {err}"));
        if let Some(error) = answer["value"]["error"].as_str() {
            return Err(format!(
                "{error}: {}",
                answer["value"]["message"].as_str().unwrap_or_default()
            ));
        }
        Ok(answer["value"].clone())
    }

    /// The page's size (the viewport, what a screenshot holds) in CSS pixels: the window is
    /// made larger by what the browser's own bars take.
    pub async fn set_size(&self, width: u32, height: u32) {
        self.set_window(width, height).await;
        let inner = self
            .script("return [window.innerWidth, window.innerHeight];", vec![])
            .await;
        if let (Some(inner_width), Some(inner_height)) = (inner[0].as_u64(), inner[1].as_u64()) {
            let grow = |outer: u32, inner: u64| outer + outer.saturating_sub(inner as u32);
            if inner_width != u64::from(width) || inner_height != u64::from(height) {
                self.set_window(grow(width, inner_width), grow(height, inner_height))
                    .await;
            }
        }
    }

    async fn set_window(&self, width: u32, height: u32) {
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .await;
    }

    /// Opens a new tab and makes it the current one (the others stay open, their pages
    /// running).
    pub async fn new_tab(&self) {
        let opened = self
            .call(
                reqwest::Method::POST,
                "/window/new",
                Some(json!({ "type": "tab" })),
            )
            .await;
        let handle = opened["handle"].as_str().unwrap_or_default().to_string();
        self.call(
            reqwest::Method::POST,
            "/window",
            Some(json!({ "handle": handle })),
        )
        .await;
    }

    /// Closes the current tab and makes the first one left current.
    pub async fn close_tab(&self) {
        let left = self.call(reqwest::Method::DELETE, "/window", None).await;
        if let Some(handle) = left.as_array().and_then(|handles| handles.first()) {
            self.call(
                reqwest::Method::POST,
                "/window",
                Some(json!({ "handle": handle })),
            )
            .await;
        }
    }

    /// Runs `script` as an async function (its last argument is the callback that ends it)
    /// and returns what it passed on.
    pub async fn script_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    pub async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` in the page (its `arguments` are `args`) and returns what it returns.
    pub async fn script(&self, script: &str, args: Vec<Value>) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The elements that match `selector` now.
    pub async fn all(&self, selector: &str) -> Vec<Element> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await;
        found
            .as_array()
            .map(|elements| {
                elements
                    .iter()
                    .filter_map(|element| element[ELEMENT].as_str())
                    .map(|id| Element(id.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The page's visible text under `selector` (every match, joined), once `done` holds
    /// of it; fails the test after [`PAGE_WAIT`] with what the page showed. Waits on the
    /// page, which a person would do too; the UI itself never polls.
    pub async fn wait_for(
        &self,
        selector: &str,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        loop {
            let text = self.text_of(selector).await;
            if done(&text) {
                return text;
            }
            assert!(
                started.elapsed() < PAGE_WAIT,
                "the page never showed {what} under {selector:?}; it shows: {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The visible text of every element matching `selector`, joined by newlines.
    pub async fn text_of(&self, selector: &str) -> String {
        let text = self
            .script(
                "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText).join('\\n');",
                vec![json!(selector)],
            )
            .await;
        text.as_str().unwrap_or_default().to_string()
    }

    /// The first element matching `selector`, waiting for one to appear.
    pub async fn find(&self, selector: &str) -> Element {
        let started = Instant::now();
        loop {
            if let Some(element) = self.all(selector).await.into_iter().next() {
                return element;
            }
            assert!(
                started.elapsed() < PAGE_WAIT,
                "no element {selector:?} appeared on the page"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the first element matching `selector`, as a person would: waiting for it to
    /// be there, and finding it again when the page drew it anew between the look and the
    /// click (a live page redraws its lists as events come).
    pub async fn press(&self, selector: &str) {
        let started = Instant::now();
        loop {
            let element = self.find(selector).await;
            match self
                .try_call(
                    reqwest::Method::POST,
                    &format!("/element/{}/click", element.0),
                    Some(json!({})),
                )
                .await
            {
                Ok(_) => return,
                Err(error) if error.starts_with("stale element") => {}
                Err(error) => panic!("clicking {selector:?}: {error}"),
            }
            assert!(
                started.elapsed() < PAGE_WAIT,
                "{selector:?} kept being redrawn under the click"
            );
        }
    }

    pub async fn click(&self, element: &Element) {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        )
        .await;
    }

    /// Types `text` into `element`.
    pub async fn type_into(&self, element: &Element, text: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/value", element.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn is_enabled(&self, element: &Element) -> bool {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{}/enabled", element.0),
            None,
        )
        .await
            == json!(true)
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let encoded = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("a base64 screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshots' folder");
        }
        std::fs::write(path, png).expect("the screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Chromium outlives its driver: its processes are the ones on this profile.
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(self._profile.path())
            .status();
    }
}
