//! A dashboard user driven over HTTP, as a browser would: its own cookie jar (the
//! `__Host-` cookies are `Secure`, which generic cookie stores refuse to send over
//! plain HTTP), forms posted as `application/x-www-form-urlencoded` with
//! `Sec-Fetch-Site: same-origin`, and the whole sign-in: invitation link, password,
//! authenticator enrolment (the seed is read from the page) and codes computed here.

use gateway_server::config::Config;
use gateway_server::dashboard::roles::Role;
use gateway_server::dashboard::{accounts, totp};
use gateway_server::store::Store;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The password every test account gets.
pub const PASSWORD: &str = "correct horse battery staple";

/// An answer as a test reads it.
#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub content_type: String,
    /// `Retry-After`, when the answer asks to wait.
    pub retry_after: Option<String>,
    pub body: String,
}

impl Page {
    /// The value of the first `name="csrf"` field.
    pub fn csrf(&self) -> String {
        field_value(&self.body, "csrf").unwrap_or_else(|| panic!("no csrf field in: {}", self.body))
    }

    /// The text of the element with this id (first text node, entities not decoded).
    pub fn text_of(&self, id: &str) -> Option<String> {
        let at = self.body.find(&format!("id=\"{id}\""))?;
        let start = at + self.body[at..].find('>')? + 1;
        let end = start + self.body[start..].find('<')?;
        Some(self.body[start..end].to_string())
    }
}

/// The value attribute of the first input named `name`.
pub fn field_value(body: &str, name: &str) -> Option<String> {
    let at = body.find(&format!("name=\"{name}\" value=\""))?;
    let start = at + format!("name=\"{name}\" value=\"").len();
    let end = start + body[start..].find('"')?;
    Some(body[start..end].to_string())
}

/// One person's browser, over HTTP.
pub struct DashClient {
    pub base_url: String,
    http: reqwest::Client,
    jar: Mutex<BTreeMap<String, String>>,
    /// The authenticator seed, once enrolled.
    pub totp_secret: Option<String>,
    /// The recovery codes shown at enrolment.
    pub recovery_codes: Vec<String>,
    /// The last TOTP step this person used (the server refuses it and older ones).
    last_step: Mutex<i64>,
    pub email: String,
}

impl DashClient {
    /// A browser with no cookies.
    pub fn new(base_url: &str) -> DashClient {
        DashClient {
            base_url: base_url.to_string(),
            http: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap(),
            jar: Mutex::new(BTreeMap::new()),
            totp_secret: None,
            recovery_codes: Vec::new(),
            last_step: Mutex::new(0),
            email: String::new(),
        }
    }

    /// A browser with no cookies that trusts only this certificate (PEM) over HTTPS.
    pub fn trusting(base_url: &str, pem: &str) -> DashClient {
        let root = reqwest::Certificate::from_pem(pem.as_bytes()).expect("a PEM certificate");
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .tls_certs_only([root])
            .build()
            .unwrap();
        DashClient { http, ..DashClient::new(base_url) }
    }

    /// The `Cookie` header this browser sends.
    pub fn cookie_header(&self) -> String {
        self.jar.lock().unwrap().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    /// A cookie's value.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.jar.lock().unwrap().get(name).cloned()
    }

    /// Sets a cookie by hand (a planted or stolen one).
    pub fn set_cookie(&self, name: &str, value: &str) {
        self.jar.lock().unwrap().insert(name.to_string(), value.to_string());
    }

    async fn finish(&self, response: reqwest::Response) -> Page {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let set_cookies: Vec<String> =
            headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect();
        {
            let mut jar = self.jar.lock().unwrap();
            for c in &set_cookies {
                let pair = c.split(';').next().unwrap();
                let (name, value) = pair.split_once('=').unwrap();
                if c.contains("Max-Age=0") {
                    jar.remove(name);
                } else {
                    jar.insert(name.to_string(), value.to_string());
                }
            }
        }
        Page {
            status,
            location: headers.get("location").map(|v| v.to_str().unwrap().to_string()),
            set_cookies,
            content_type: headers.get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default(),
            retry_after: headers.get("retry-after").map(|v| v.to_str().unwrap().to_string()),
            body: response.text().await.unwrap(),
        }
    }

    /// GET a path.
    pub async fn get(&self, path: &str) -> Page {
        let response = self.get_response(path).await;
        self.finish(response).await
    }

    /// GET a path; the answer as it arrives (its body not yet read, no cookie taken).
    pub async fn get_response(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base_url))
            .header("cookie", self.cookie_header())
            .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
            .send()
            .await
            .expect("the gateway answers")
    }

    /// POST a form as a same-origin page would.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        self.post_with(path, fields, &[("sec-fetch-site", "same-origin")]).await
    }

    /// POST a form with these extra headers (none: a client without fetch metadata).
    pub async fn post_with(&self, path: &str, fields: &[(&str, &str)], headers: &[(&str, &str)]) -> Page {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base_url))
            .header("cookie", self.cookie_header())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(fields).unwrap());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.finish(request.send().await.expect("the gateway answers")).await
    }

    /// POST a form with the CSRF token of the page at `form_page`.
    pub async fn submit(&self, form_page: &str, path: &str, fields: &[(&str, &str)]) -> Page {
        let csrf = self.get(form_page).await.csrf();
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend_from_slice(fields);
        self.post(path, &all).await
    }

    /// The authenticator's code of a step.
    pub fn code_at_step(&self, step: i64) -> String {
        let secret = self.totp_secret.as_deref().expect("enrolled");
        totp::code_at(&totp::base32_decode(secret).unwrap(), step)
    }

    /// Takes over an authenticator enrolled elsewhere (in a browser): its seed and the
    /// step of the code that confirmed it.
    pub fn enrolled(&mut self, secret: &str, step: i64) {
        self.totp_secret = Some(secret.to_string());
        *self.last_step.lock().unwrap() = step;
    }

    /// The step of now.
    pub fn now_step() -> i64 {
        totp::step_of(chrono::Utc::now().timestamp())
    }

    /// The last step used.
    pub fn last_step(&self) -> i64 {
        *self.last_step.lock().unwrap()
    }

    /// A code the server has not seen yet, valid now (waits for the next step when
    /// every step in the skew window was used), and marks its step used.
    pub async fn fresh_code(&self) -> String {
        loop {
            let now = Self::now_step();
            let step = (now - 1).max(self.last_step() + 1);
            if step <= now + 1 {
                *self.last_step.lock().unwrap() = step;
                return self.code_at_step(step);
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Accepts a sign-in link: sets the password, enrols an authenticator; signed in.
    pub async fn accept_link(&mut self, link: &str) {
        let code = link.split_once('#').expect("the link has a #code").1;
        let page = self.get("/invite").await;
        assert_eq!(page.status, 200);
        let csrf = page.csrf();
        let answer = self
            .post("/invite", &[("csrf", &csrf), ("token", code), ("password", PASSWORD), ("password2", PASSWORD)])
            .await;
        assert_eq!(answer.status, 303, "invite: {}", answer.body);
        assert_eq!(answer.location.as_deref(), Some("/login/enroll"));
        let enroll = self.get("/login/enroll").await;
        let secret: String =
            enroll.text_of("totp-secret").expect("the seed is shown").chars().filter(|c| !c.is_whitespace()).collect();
        self.totp_secret = Some(secret);
        let csrf = enroll.csrf();
        // The server stores the earliest step of the window the code matches: this one.
        let step = Self::now_step();
        *self.last_step.lock().unwrap() = step;
        let done = self.post("/login/enroll", &[("csrf", &csrf), ("code", &self.code_at_step(step))]).await;
        assert_eq!(done.status, 200, "enrol: {}", done.body);
        let list = done.body.split("id=\"recovery-codes\"").nth(1).expect("recovery codes shown");
        let list = &list[..list.find("</ol>").unwrap()];
        self.recovery_codes = list.split("<li>").skip(1).map(|s| s[..s.find('<').unwrap()].to_string()).collect();
        assert_eq!(self.recovery_codes.len(), 10);
    }

    /// The password step of a sign-in; the answer must lead to the code step.
    pub async fn password_step(&self) {
        let csrf = self.get("/login").await.csrf();
        let first = self.post("/login", &[("csrf", &csrf), ("email", &self.email), ("password", PASSWORD)]).await;
        assert_eq!(first.location.as_deref(), Some("/login/mfa"), "password step: {} {}", first.status, first.body);
    }

    /// The code step of a sign-in with this code.
    pub async fn code_step(&self, code: &str) -> Page {
        let csrf = self.get("/login/mfa").await.csrf();
        self.post("/login/mfa", &[("csrf", &csrf), ("code", code)]).await
    }

    /// Signs out.
    pub async fn sign_out(&self) {
        let csrf = self.get("/dashboard").await.csrf();
        let out = self.post("/logout", &[("csrf", &csrf)]).await;
        assert_eq!(out.location.as_deref(), Some("/login"));
    }

    /// POST a raw body with a content type.
    pub async fn post_raw(&self, path: &str, content_type: &str, body: &str) -> Page {
        let request = self
            .http
            .post(format!("{}{path}", self.base_url))
            .header("cookie", self.cookie_header())
            .header("content-type", content_type)
            .header("sec-fetch-site", "same-origin")
            .body(body.to_string());
        self.finish(request.send().await.expect("the gateway answers")).await
    }
}

/// A signed-in person of `customer_id` (or an operator) with `role`.
pub async fn signed_in(
    store: &Store,
    config: &Config,
    base_url: &str,
    customer_id: Option<&str>,
    email: &str,
    role: Role,
) -> DashClient {
    let mut config = config.clone();
    config.public_url = Some(base_url.to_string());
    let (_, link) = accounts::create(store, &config, customer_id, email, role, "test").await.expect("account");
    let mut client = DashClient::new(base_url);
    client.email = email.to_string();
    client.accept_link(&link).await;
    client
}
