//! `loops ui` in a real headless browser (Debian's `chromium`, driven through `chromedriver`
//! with fantoccini), and its guards over plain HTTP.
//!
//! This test process holds a redb store and serves its control endpoint, as a workflow's
//! process does; `loops ui` (the binary) reaches it through that endpoint. The browser test
//! sees a run progress on the runs page without a reload, approves a waiting run by filling
//! the send form (pre-filled with a skeleton of the declared payload) and confirming, cancels
//! another, retries a failed one, checks that a payload's markup stays text,
//! and keeps screenshots under `target/ui-screenshots/`.
//!
//! Needs `chromium` and `chromedriver` on the PATH (`apt-get install chromium
//! chromium-driver`; `.ci/run` installs them). Every wait is for a condition, never a fixed
//! time.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use loops_core::control::ControlServer;
use loops_core::{BoxError, Context, RetryPolicy, RunStatus, Runtime, StartOptions};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A document drafted on an event, then approved on another.
#[derive(loops_derive::Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[workflow(crate = loops_core)]
#[event(draft: Draft, approve: Approval)]
enum Review {
    #[initial]
    #[next(Drafted)]
    Asked { doc: String },
    #[next(Done)]
    Drafted { text: String },
    #[terminal]
    Done { by: String },
}

#[derive(loops_derive::Schema, Debug, Serialize, Deserialize)]
#[schema(crate = loops_core)]
struct Draft {
    text: String,
}

#[derive(loops_derive::Schema, Debug, Serialize, Deserialize)]
#[schema(crate = loops_core)]
struct Approval {
    by: String,
}

struct Reviewer;

impl ReviewHandler for Reviewer {
    type Error = BoxError;
    async fn asked(&self, ctx: &Context, _: String) -> Result<AskedNext, BoxError> {
        let draft: Draft = ctx.wait_for("draft").await?;
        // A draft that says "fail" fails the first attempt (the run has no retries): the
        // run `retry-1`, for the retry button.
        if draft.text == "fail" && ctx.attempt() == 1 {
            return Err("the draft says fail".into());
        }
        let text = draft.text.clone();
        let words: usize = ctx
            .step("count words", || {
                let text = text.clone();
                async move { Ok(text.split_whitespace().count()) }
            })
            .await?;
        Ok(AskedNext::Drafted {
            text: format!("{} ({words} words)", draft.text),
        })
    }
    async fn drafted(&self, ctx: &Context, _: String) -> Result<DraftedNext, BoxError> {
        let approval: Approval = ctx.wait_for("approve").await?;
        Ok(DraftedNext::Done { by: approval.by })
    }
}

/// Markup a model could write into a payload: shown as text, it runs nothing.
const MARKUP: &str = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">";

/// Longest wait for a condition: generous, for a loaded machine; a wait ends as soon as
/// its condition holds.
const PATIENCE: Duration = Duration::from_secs(120);

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn until_status(rt: &Runtime, run_id: &str, status: RunStatus, state: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let info = rt.run_info(run_id).await.unwrap();
        if info
            .as_ref()
            .is_some_and(|i| i.status == status && i.state == state)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} never reached {status} in {state}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A store held by this process with its control endpoint served, and these runs:
/// `progress-1` waiting for `draft` in `Asked`; `approve-1` waiting for `approve` in
/// `Drafted` (its draft holds [`MARKUP`]); `cancel-1` waiting for `draft`; `retry-1` failed
/// in `Asked` (its draft says "fail").
struct Held {
    rt: Runtime,
    server: Option<ControlServer>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

async fn held() -> Held {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rt = Runtime::builder()
        .retry(RetryPolicy::never())
        .register::<Review, _>(Reviewer)
        .open(&path)
        .unwrap();
    for id in ["progress-1", "approve-1", "cancel-1", "retry-1"] {
        rt.start_with(
            id,
            Review::Asked {
                doc: "spec.md".into(),
            },
            attributes(),
        )
        .await
        .unwrap();
        until_status(&rt, id, RunStatus::Waiting, "Asked").await;
    }
    rt.send("approve-1", "draft", &json!({ "text": MARKUP }))
        .await
        .unwrap();
    until_status(&rt, "approve-1", RunStatus::Waiting, "Drafted").await;
    rt.send("retry-1", "draft", &json!({ "text": "fail" }))
        .await
        .unwrap();
    until_status(&rt, "retry-1", RunStatus::Failed, "Asked").await;
    let server = rt.serve_control_next_to_store().await.unwrap();
    Held {
        rt,
        server: Some(server),
        path,
        _dir: dir,
    }
}

impl Held {
    /// Stops serving and closes the store; returns its directory (the file stays).
    async fn stop(mut self) -> tempfile::TempDir {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        self.rt.shutdown().await;
        drop(self.rt);
        self._dir
    }
}

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `loops --store STORE ui --listen 127.0.0.1:0`, and the address it printed.
fn loops_ui(store: &Path) -> (Killed, SocketAddr) {
    loops_ui_with(&["--store".into(), store.display().to_string()])
}

/// `loops STORE_ARGS ui --listen 127.0.0.1:0`, and the address it printed.
fn loops_ui_with(store_args: &[String]) -> (Killed, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loops"))
        .env_remove("LOOPS_STORE")
        .env("NO_COLOR", "1")
        .args(store_args)
        .args(["ui", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child = Killed(child);
    // "loops ui: serving the runs of store S on http://ADDR/ (loopback only); Ctrl-C stops"
    assert!(
        line.starts_with("loops ui: serving the runs of store ")
            && line.contains("(loopback only); Ctrl-C stops"),
        "{line:?}"
    );
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// The directory of a program on the PATH.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `chromedriver` on a free port, and the path of `chromium`; a clear failure if either is
/// missing.
fn chromedriver() -> (Killed, u16, PathBuf) {
    let install = "the browser test needs Debian's chromium and chromedriver: apt-get install -y chromium chromium-driver (.ci/run installs them)";
    let chromium = on_path("chromium")
        .or_else(|| on_path("chromium-browser"))
        .unwrap_or_else(|| panic!("no chromium on the PATH; {install}"));
    let driver =
        on_path("chromedriver").unwrap_or_else(|| panic!("no chromedriver on the PATH; {install}"));
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Killed(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver never listened on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port, chromium)
}

async fn browser(port: u16, chromium: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            // --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1000"],
        }),
    );
    ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| panic!("chromedriver started no chromium session: {e}"))
}

/// `document.querySelector(css).textContent`, trimmed (`None` if there is no such element).
async fn text(client: &Client, css: &str) -> Option<String> {
    let found = client
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent.trim() : null;",
            vec![json!(css)],
        )
        .await
        .unwrap();
    found.as_str().map(str::to_owned)
}

/// Waits until the text of `css` is `want`.
async fn until_text(client: &Client, css: &str, want: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = text(client, css).await;
        if got.as_deref() == Some(want) {
            return;
        }
        if Instant::now() > deadline {
            let page = text(client, "body").await.unwrap_or_default();
            panic!("{css} never showed {want:?} (last {got:?}); the page says: {page}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks `css` (found afresh: a refresh may have replaced an earlier element).
async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}

/// Whether the dialog of form `form` is open.
async fn dialog_open(client: &Client, form: &str) -> bool {
    let css = format!("{form} dialog[open]");
    text(client, &css).await.is_some()
}

fn screenshots() -> PathBuf {
    // target/debug/deps/ui-HASH -> target/ui-screenshots
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    std::fs::write(screenshots().join(name), png).unwrap();
}

#[test]
fn a_browser_follows_a_run_approves_one_cancels_another_and_retries_a_failed_one() {
    let (_driver, port, chromium) = chromedriver();
    let tokio = tokio();
    let held = tokio.block_on(held());
    let (_ui, addr) = loops_ui(&held.path);
    let base = format!("http://{addr}");
    tokio.block_on(async {
        let client = browser(port, &chromium).await;

        // The runs page shows each run; one progresses while the page is open.
        client.goto(&format!("{base}/")).await.unwrap();
        until_text(&client, r#"tr[data-run="progress-1"] td.state"#, "Asked").await;
        until_text(&client, r#"tr[data-run="approve-1"] [data-status]"#, "waiting").await;
        client
            .execute("window.__same_page = true;", vec![])
            .await
            .unwrap();
        held.rt
            .send("progress-1", "draft", &json!({ "text": "two words" }))
            .await
            .unwrap();
        until_text(&client, r#"tr[data-run="progress-1"] td.state"#, "Drafted").await;
        let same = client
            .execute("return window.__same_page === true;", vec![])
            .await
            .unwrap();
        assert_eq!(same, json!(true), "the page was reloaded");
        screenshot(&client, "runs.png").await;

        // approve-1: its draft's markup is text on the page (inside JSON, whose quotes are
        // escaped); nothing of it ran.
        client.goto(&format!("{base}/runs/approve-1")).await.unwrap();
        until_text(&client, "#state", "Drafted").await;
        let shown = client
            .execute(
                "return [window.__xss === undefined, document.body.textContent.includes(arguments[0]), document.querySelectorAll('main script, main img[src=x]').length];",
                vec![json!(MARKUP.split('"').next().unwrap())],
            )
            .await
            .unwrap();
        assert_eq!(shown, json!([true, true, 0]));
        assert_eq!(
            client
                .find(Locator::Css("#send-form input[name=event]"))
                .await
                .unwrap()
                .prop("value")
                .await
                .unwrap()
                .as_deref(),
            Some("approve"),
            "the form names the event the run waits for"
        );

        // The payload starts as a skeleton of the declared `approve: Approval { by: String }`.
        let payload = client
            .find(Locator::Css("#send-form textarea[name=payload]"))
            .await
            .unwrap();
        assert_eq!(
            payload.prop("value").await.unwrap().as_deref(),
            Some("{\n  \"by\": \"\"\n}")
        );

        // A payload that is not JSON is refused before the confirmation.
        payload.clear().await.unwrap();
        payload.send_keys(r#"{"by": "alice""#).await.unwrap();
        click(&client, "#send-form [data-confirm]").await;
        let problem = text(&client, "#send-form .json-error").await.unwrap();
        assert!(problem.starts_with("The payload is not valid JSON"), "{problem}");
        assert!(!dialog_open(&client, "#send-form").await);

        // Then valid: the confirmation shows it; confirming sends it.
        payload.send_keys("}").await.unwrap();
        click(&client, "#send-form [data-confirm]").await;
        assert!(dialog_open(&client, "#send-form").await);
        assert_eq!(
            text(&client, r#"#send-form pre[data-fill="payload"]"#).await.as_deref(),
            Some(r#"{"by": "alice"}"#)
        );
        screenshot(&client, "confirm.png").await;
        click(&client, "#send-form dialog button[type=submit]").await;
        until_text(&client, "#status [data-status]", "completed").await;
        until_text(&client, "#state", "Done").await;
        let note = text(&client, "p.note").await.unwrap();
        assert!(note.starts_with("sent event `approve` (event seq 1)"), "{note}");
        screenshot(&client, "run.png").await;

        // cancel-1: cancelled through its form and confirmation.
        client.goto(&format!("{base}/runs/cancel-1")).await.unwrap();
        until_text(&client, "#state", "Asked").await;
        let reason = client
            .find(Locator::Css("#cancel-form input[name=reason]"))
            .await
            .unwrap();
        reason.send_keys("not needed").await.unwrap();
        click(&client, "#cancel-form [data-confirm]").await;
        assert!(dialog_open(&client, "#cancel-form").await);
        click(&client, "#cancel-form dialog button[type=submit]").await;
        until_text(&client, "#status [data-status]", "cancelled").await;

        // retry-1: failed; retried through its button and confirmation, it runs again (its
        // second attempt takes the same draft and moves on to wait for an approval).
        client.goto(&format!("{base}/runs/retry-1")).await.unwrap();
        until_text(&client, "#status [data-status]", "failed").await;
        assert!(!dialog_open(&client, "#retry-form").await);
        click(&client, "#retry-form [data-confirm]").await;
        assert!(dialog_open(&client, "#retry-form").await);
        screenshot(&client, "retry.png").await;
        click(&client, "#retry-form dialog button[type=submit]").await;
        until_text(&client, "#state", "Drafted").await;
        until_text(&client, "#status [data-status]", "waiting").await;
        let note = text(&client, "p.note").await.unwrap();
        assert!(note.contains("again in state Asked (seq 0)"), "{note}");
        client.close().await.unwrap();
    });

    // What the runtime holds: each run exactly where the page said.
    tokio.block_on(async {
        let rt = &held.rt;
        until_status(rt, "approve-1", RunStatus::Completed, "Done").await;
        let history = rt.history::<Review>("approve-1").await.unwrap();
        let values: Vec<Review> = history.into_iter().map(|t| t.value).collect();
        assert_eq!(
            values,
            vec![
                Review::Asked {
                    doc: "spec.md".into()
                },
                Review::Drafted {
                    text: format!("{MARKUP} (7 words)")
                },
                Review::Done { by: "alice".into() },
            ]
        );
        let cancelled = rt.run_info("cancel-1").await.unwrap().unwrap();
        assert_eq!(
            (cancelled.status, cancelled.cancel.as_deref()),
            (RunStatus::Cancelled, Some("not needed"))
        );
        until_status(rt, "progress-1", RunStatus::Waiting, "Drafted").await;
        until_status(rt, "retry-1", RunStatus::Waiting, "Drafted").await;
        let retried = rt.history::<Review>("retry-1").await.unwrap();
        let values: Vec<Review> = retried.into_iter().map(|t| t.value).collect();
        assert_eq!(
            values,
            vec![
                Review::Asked {
                    doc: "spec.md".into()
                },
                Review::Drafted {
                    text: "fail (1 words)".into()
                },
            ]
        );
        let failures = rt.store().failures("retry-1").await.unwrap();
        assert_eq!(
            failures
                .iter()
                .map(|(seq, f)| (*seq, f.attempt, f.errors.clone()))
                .collect::<Vec<_>>(),
            vec![(0, 1, vec!["the draft says fail".to_owned()])]
        );
    });
    drop(tokio.block_on(held.stop()));
}

/// One HTTP/1.1 request to `addr` with `headers` (and `body`, form-encoded); returns the
/// status and the body.
fn request(addr: SocketAddr, head: &str, headers: &[(&str, String)], body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut text = format!("{head} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if head.starts_with("POST") {
        text.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).unwrap();
    answer(stream)
}

/// The status and the body of the answer read from `stream` to its end.
fn answer(mut stream: TcpStream) -> (u16, String) {
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A form POST to `addr` that announces `bytes` of body and sends none: the answer of a
/// server that refuses it by its length alone (status and body).
fn announced_only(
    addr: SocketAddr,
    head: &str,
    headers: &[&(&str, String)],
    bytes: usize,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut text = format!("{head} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!(
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {bytes}\r\n\r\n"
    ));
    stream.write_all(text.as_bytes()).unwrap();
    answer(stream)
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            let v: String = v
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[test]
fn writes_need_the_token_and_the_page_s_origin_and_pages_answer_only_their_host() {
    let tokio = tokio();
    let held = tokio.block_on(held());
    let (_ui, addr) = loops_ui(&held.path);
    let host = ("Host", addr.to_string());
    let origin = ("Origin", format!("http://{addr}"));

    // The page escapes the payload's markup.
    let (status, page) = request(addr, "GET /runs/approve-1", std::slice::from_ref(&host), "");
    assert_eq!(status, 200);
    assert!(page.contains("&lt;script&gt;window.__xss = 1&lt;/script&gt;"));
    assert!(!page.contains("<script>window"));
    let token = token_of(&page);
    assert_eq!(token.len(), 64);

    // Another Host (a DNS rebinding page) is refused, for reads too.
    let evil = ("Host", format!("evil.example:{}", addr.port()));
    assert_eq!(request(addr, "GET /", &[evil], "").0, 421);
    // `localhost` names the loopback address.
    let local = ("Host", format!("localhost:{}", addr.port()));
    assert_eq!(
        request(addr, "GET /", std::slice::from_ref(&local), "").0,
        200
    );
    // A status the filter does not know is said in the table; the workflows are still
    // offered.
    let (status, page) = request(addr, "GET /?status=bogus", &[local], "");
    assert_eq!(status, 200);
    assert!(
        page.contains(r#"<td class="problem" colspan="8">no status `bogus`</td>"#),
        "{page}"
    );
    assert!(
        page.contains(r#"<option value="review">review</option>"#),
        "{page}"
    );

    // The reason holds a bidirectional override, which the page shows escaped.
    let cancel = form(&[("token", &token), ("reason", "from \u{202e}elsewhere")]);
    // No Origin, another Origin, a cross-site fetch: refused.
    let path = "POST /runs/cancel-1/cancel";
    assert_eq!(
        request(addr, path, std::slice::from_ref(&host), &cancel).0,
        403
    );
    let other = ("Origin", "http://evil.example".to_owned());
    assert_eq!(request(addr, path, &[host.clone(), other], &cancel).0, 403);
    let site = ("Sec-Fetch-Site", "cross-site".to_owned());
    assert_eq!(
        request(addr, path, &[host.clone(), origin.clone(), site], &cancel).0,
        403
    );
    // The right origin without the token: refused.
    let tokenless = form(&[("token", "0"), ("reason", "no token")]);
    let (status, body) = request(addr, path, &[host.clone(), origin.clone()], &tokenless);
    assert_eq!(status, 403, "{body}");
    // A payload that is not JSON: refused, nothing sent.
    let bad = form(&[
        ("token", &token),
        ("event", "approve"),
        ("payload", "{by: 1"),
    ]);
    let (status, body) = request(
        addr,
        "POST /runs/approve-1/send",
        &[host.clone(), origin.clone()],
        &bad,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("the payload is not valid JSON"), "{body}");
    // Valid syntax, but a lone surrogate escape: refused the same way.
    let lone = form(&[
        ("token", &token),
        ("event", "approve"),
        ("payload", r#"{"by":"\ud800"}"#),
    ]);
    let (status, body) = request(
        addr,
        "POST /runs/approve-1/send",
        &[host.clone(), origin.clone()],
        &lone,
    );
    assert_eq!(status, 400, "{body}");
    // Before the store is reached: the message is the form's, not the run's refusal.
    assert!(
        body.contains(
            r#"<p class="problem" role="alert">the payload holds a lone surrogate escape (such as \ud800 without its pair), which is no character and no payload can hold: unexpected end of hex escape at line 1 column 14</p>"#
        ),
        "{body}"
    );

    // A send without its page key (a hand-made request: the page's form carries one), or
    // with a blank one, would be a second event if sent twice: refused, nothing sent.
    for key in [None, Some(" ")] {
        let mut fields = vec![
            ("token", token.as_str()),
            ("event", "approve"),
            ("payload", r#"{"by":"ann"}"#),
        ];
        fields.extend(key.map(|k| ("key", k)));
        let (status, body) = request(
            addr,
            "POST /runs/approve-1/send",
            &[host.clone(), origin.clone()],
            &form(&fields),
        );
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains(
                "the form has no page key (the run's page puts one in its send form, so that \
                 a form sent twice is one event): send it from the run's page"
            ),
            "{body}"
        );
    }

    // A form missing a field: 400, on a page that says so (not axum's plain text).
    let (status, body) = request(
        addr,
        path,
        &[host.clone(), origin.clone()],
        &form(&[("reason", "no token field")]),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(
            "this request is not a form this loops ui sends (Failed to deserialize form body: missing field `token`)"
        ),
        "{body}"
    );
    // A run id the CLI refuses (a control character): 400 saying why, the byte not echoed.
    let (status, body) = request(
        addr,
        "GET /runs/a%1b%5b31mb",
        std::slice::from_ref(&host),
        "",
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("invalid run id") && body.contains("contains control characters"),
        "{body}"
    );
    assert!(!body.contains('\u{1b}'), "{body}");
    // Bytes that are not UTF-8: 400 on the failure page too (not axum's plain text).
    let (status, body) = request(addr, "GET /runs/%FF", std::slice::from_ref(&host), "");
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("the run id in the URL cannot be read") && body.contains("<html"),
        "{body}"
    );
    // A run that does not exist: 404, nothing written.
    let unknown = form(&[("token", &token), ("reason", "gone")]);
    let (status, body) = request(
        addr,
        "POST /runs/nope-1/cancel",
        &[host.clone(), origin.clone()],
        &unknown,
    );
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("run `nope-1` does not exist in store"),
        "{body}"
    );
    // Forms as large as an event's payload may be: 800 KB of text that is not ASCII arrives
    // percent-encoded as 2.4 MB, over axum's default limit (it was refused as "not a form
    // this loops ui sends"), and is sent; a payload over loops' limit is refused as `loops
    // send` refuses it; a form over the page's own limit gets 413, saying what to use.
    let wide = json!({ "text": "é".repeat(400_000) }).to_string();
    let send = form(&[
        ("token", &token),
        ("event", "draft"),
        ("payload", &wide),
        ("key", "ui-0-0"),
    ]);
    assert!(send.len() > 2_400_000, "{}", send.len());
    let (status, body) = request(
        addr,
        "POST /runs/cancel-1/send",
        &[host.clone(), origin.clone()],
        &send,
    );
    assert_eq!(status, 303, "{body}");
    let over = json!({ "text": "a".repeat(loops_core::DEFAULT_MAX_PAYLOAD_BYTES) }).to_string();
    let send = form(&[
        ("token", &token),
        ("event", "draft"),
        ("payload", &over),
        ("key", "ui-0-1"),
    ]);
    let (status, body) = request(
        addr,
        "POST /runs/cancel-1/send",
        &[host.clone(), origin.clone()],
        &send,
    );
    assert_eq!(status, 400, "{}", &body[..body.len().min(2000)]);
    assert!(
        body.contains(&format!(
            "is {} bytes, over the {}-byte limit",
            over.len(),
            loops_core::DEFAULT_MAX_PAYLOAD_BYTES
        )),
        "{}",
        &body[..body.len().min(2000)]
    );
    let (status, body) =
        announced_only(addr, "POST /runs/cancel-1/send", &[&host, &origin], 7 << 20);
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("loops send RUN EVENT --json-file FILE"),
        "{body}"
    );
    tokio.block_on(async {
        let events = held.rt.store().events("cancel-1").await.unwrap();
        let sizes: Vec<usize> = events
            .iter()
            .map(|(_, e, _)| e.payload.get().len())
            .collect();
        assert_eq!(sizes, [wide.len()]);
    });

    // The page's key names the form drawn: the same form sent again is one event, another
    // event typed on the same page (a second tab) is sent, not dropped as "sent already".
    for (event, payload) in [
        ("draft", r#"{"text": "a"}"#),
        ("draft", r#"{ "text":"a" }"#),
        ("approve", r#"{"by": "bob"}"#),
    ] {
        let send = form(&[
            ("token", &token),
            ("key", "ui-0-0"),
            ("event", event),
            ("payload", payload),
        ]);
        let (status, body) = request(
            addr,
            "POST /runs/progress-1/send",
            &[host.clone(), origin.clone()],
            &send,
        );
        assert_eq!(status, 303, "{body}");
    }
    tokio.block_on(async {
        let events = held.rt.store().events("progress-1").await.unwrap();
        let names: Vec<&str> = events.iter().map(|(_, e, _)| e.name.as_str()).collect();
        assert_eq!(names, ["draft", "approve"]);
    });
    tokio.block_on(async {
        let rt = &held.rt;
        let info = rt.run_info("cancel-1").await.unwrap().unwrap();
        assert_eq!((info.status, info.cancel), (RunStatus::Waiting, None));
        let events = rt.store().events("approve-1").await.unwrap();
        assert_eq!(events.len(), 1, "only the draft: {events:?}");
    });

    // With the token and the page's origin: done, and back to the run's page.
    let (status, _) = request(addr, path, &[host.clone(), origin.clone()], &cancel);
    assert_eq!(status, 303);
    tokio.block_on(async {
        let info = held.rt.run_info("cancel-1").await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.cancel.as_deref()),
            (RunStatus::Cancelled, Some("from \u{202e}elsewhere"))
        );
    });
    let (_, page) = request(addr, "GET /runs/cancel-1", std::slice::from_ref(&host), "");
    assert!(page.contains("from \\u{202e}elsewhere"), "{page}");
    assert!(!page.contains('\u{202e}'), "{page}");
    let graph = request(
        addr,
        "GET /runs/approve-1/graph.svg",
        std::slice::from_ref(&host),
        "",
    );
    assert_eq!(graph.0, 200);
    assert!(graph.1.contains("<svg"), "{}", graph.1);
    // A cancel form with no reason: the UI's own default reason (not the CLI's).
    let (status, _) = request(
        addr,
        "POST /runs/approve-1/cancel",
        &[host, origin],
        &form(&[("token", &token), ("reason", "")]),
    );
    assert_eq!(status, 303);
    tokio.block_on(async {
        let info = held.rt.run_info("approve-1").await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.cancel.as_deref()),
            (RunStatus::Cancelled, Some("cancelled in the loops web UI"))
        );
    });
    drop(tokio.block_on(held.stop()));
}

/// The token in a page's forms.
fn token_of(page: &str) -> String {
    page.split(r#"name="token" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no token in {page}"))
        .to_owned()
}

/// The attributes the runs start with, which the run page lists.
fn attributes() -> StartOptions {
    StartOptions::default()
        .attribute("owner", "alice <a&b>")
        .attribute("issue", 17)
}

/// Shows `cancel-1` waiting, cancels it through the UI at `addr` as a page would, and shows
/// it cancelled.
fn cancel_through_the_page(addr: SocketAddr) {
    let host = ("Host", addr.to_string());
    let origin = ("Origin", format!("http://{addr}"));
    let (status, page) = request(addr, "GET /runs/cancel-1", std::slice::from_ref(&host), "");
    assert_eq!(status, 200, "{page}");
    // The run's attributes, escaped, by key.
    assert!(
        page.contains(r#"<dd class="attribute"><code>issue</code> = 17 (int)</dd>"#),
        "{page}"
    );
    assert!(
        page.contains(
            r#"<dd class="attribute"><code>owner</code> = alice &lt;a&amp;b&gt; (str)</dd>"#
        ),
        "{page}"
    );
    assert!(page.contains(r#"data-status="waiting""#), "{page}");
    let cancel = form(&[("token", &token_of(&page)), ("reason", "from the page")]);
    let (status, body) = request(
        addr,
        "POST /runs/cancel-1/cancel",
        &[host.clone(), origin],
        &cancel,
    );
    assert_eq!(status, 303, "{body}");
    let (_, page) = request(addr, "GET /runs/cancel-1", std::slice::from_ref(&host), "");
    assert!(page.contains(r#"data-status="cancelled""#), "{page}");
    assert!(page.contains("from the page"), "{page}");
    // The write's note (the first of this UI: 0) shows on its run's page, and on no other
    // run's (helper-127 LOW 1: a completed run's page read "cancellation asked").
    let note = r#"<p class="note" role="status">"#;
    let (_, page) = request(
        addr,
        "GET /runs/cancel-1?note=0",
        std::slice::from_ref(&host),
        "",
    );
    assert!(page.contains(note), "{page}");
    let (_, page) = request(addr, "GET /runs/approve-1?note=0", &[host], "");
    assert!(
        page.contains(r#"data-status=""#) && !page.contains(note),
        "{page}"
    );
}

#[test]
fn the_page_reads_and_writes_a_file_no_process_holds_and_a_postgresql_store() {
    let tokio = tokio();
    // A file: the UI opens it for each request (writable for the cancel), and lets it go.
    let dir = tokio.block_on(async { held().await.stop().await });
    let path = dir.path().join("store.redb");
    let (ui, addr) = loops_ui(&path);
    cancel_through_the_page(addr);
    drop(ui);
    let rt = Runtime::builder()
        .register::<Review, _>(Reviewer)
        .open(&path)
        .unwrap();
    let info = tokio.block_on(rt.run_info("cancel-1")).unwrap().unwrap();
    assert_eq!(
        (info.status, info.cancel.as_deref()),
        (RunStatus::Cancelled, Some("from the page"))
    );
    drop(rt);

    // PostgreSQL, with a worker serving: the UI's cancel reaches the run through the store.
    let url = std::env::var("LOOPS_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("lc_ui_{}", std::process::id());
    let rt = tokio.block_on(async {
        let store = loops_postgres::PgStore::builder(url.as_str())
            .schema(&schema)
            .connect()
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL is not reachable at {url} ({e}); the tests need it")
            });
        let rt = Runtime::builder()
            .retry(RetryPolicy::never())
            .register::<Review, _>(Reviewer)
            .build(store);
        rt.start_with(
            "cancel-1",
            Review::Asked {
                doc: "spec.md".into(),
            },
            attributes(),
        )
        .await
        .unwrap();
        // Another run, whose page must not show the cancel's note.
        rt.start("approve-1", Review::Asked { doc: "b.md".into() })
            .await
            .unwrap();
        let serving = rt.clone();
        tokio::spawn(async move { serving.serve(Duration::from_millis(50)).await });
        until_status(&rt, "cancel-1", RunStatus::Waiting, "Asked").await;
        rt
    });
    let (ui, addr) = loops_ui_with(&[
        "--store".into(),
        url.clone(),
        "--pg-schema".into(),
        schema.clone(),
    ]);
    cancel_through_the_page(addr);
    drop(ui);
    tokio.block_on(async {
        until_status(&rt, "cancel-1", RunStatus::Cancelled, "Asked").await;
        let info = rt.run_info("cancel-1").await.unwrap().unwrap();
        assert_eq!(info.cancel.as_deref(), Some("from the page"));
        rt.shutdown().await;
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}
