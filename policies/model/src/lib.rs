//! The policy data model shared by the gateway (host) and the policy SDK (guest tests).
//!
//! A policy sees one [`Context`] per send and answers a [`Verdict`]. The WIT interface
//! (`policies/wit/`) is the wire form between host and module; this crate is the JSON
//! form of the same data, used by fixture files (`gateway policy test`, the SDK's
//! native `testing` module) and by `gateway policy eval`. Keeping it in one crate
//! means a fixture file means the same thing to `cargo test` and to the real sandbox.
//!
//! Every field of a context has a default, so a fixture states only what matters to
//! it; unknown fields are refused, so a misspelt field fails loudly instead of testing
//! the default.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The purposes the specification allows.
pub const PURPOSES: [&str; 5] = ["transactional", "operational", "support", "internal_team", "authentication"];

/// Where in the send pipeline the decision is asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Before suppression; a denial is 422 `message_purpose_not_allowed`.
    Purpose,
    /// After suppression; a denial is 403 `policy_violation`.
    #[default]
    Content,
}

impl Stage {
    /// Both stages, in pipeline order.
    pub const ALL: [Stage; 2] = [Stage::Purpose, Stage::Content];

    /// The name used in JSON, logs and module metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Purpose => "purpose",
            Stage::Content => "content",
        }
    }

    /// The stage with this name.
    pub fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// Who asked for the send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    #[default]
    Api,
    Pbx,
    Dashboard,
}

impl Source {
    /// The name used in JSON and the message log.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Pbx => "pbx",
            Source::Dashboard => "dashboard",
        }
    }

    /// The source with this name.
    pub fn parse(name: &str) -> Option<Source> {
        [Source::Api, Source::Pbx, Source::Dashboard].into_iter().find(|s| s.as_str() == name)
    }
}

/// Kind of attached media.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediaKind {
    Image,
    Document,
    Audio,
}

/// Media attached to the message (never its bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Media {
    pub kind: MediaKind,
    #[serde(default)]
    pub mime_type: String,
    #[serde(default)]
    pub file_name: String,
    /// Decoded size; 0 for a URL the provider fetches.
    #[serde(default)]
    pub size_bytes: u64,
}

/// The recipient of the send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RecipientJson")]
pub struct Recipient {
    /// E.164.
    pub phone: String,
    /// Country calling code.
    pub country_code: u16,
}

impl Default for Recipient {
    fn default() -> Self {
        Recipient { phone: "+14155550123".into(), country_code: 1 }
    }
}

/// A recipient as written in JSON: the country code may be left out and is then read
/// off the number.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipientJson {
    #[serde(default)]
    phone: Option<String>,
    #[serde(default)]
    country_code: Option<u16>,
}

impl From<RecipientJson> for Recipient {
    fn from(r: RecipientJson) -> Recipient {
        let phone = r.phone.unwrap_or_else(|| Recipient::default().phone);
        let country_code = r.country_code.or_else(|| country_code_of(&phone)).unwrap_or(0);
        Recipient { phone, country_code }
    }
}

/// The sending instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Instance {
    pub id: String,
    pub name: String,
    /// Whole days since it was created.
    pub age_days: u32,
    /// `open`, `connecting` or `close`.
    pub connection_state: String,
}

impl Default for Instance {
    fn default() -> Self {
        Instance { id: "ins_test".into(), name: "main".into(), age_days: 30, connection_state: "open".into() }
    }
}

/// The customer that owns the instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Customer {
    pub id: String,
    /// `starter`, `scale`, or empty.
    pub plan: String,
    /// Purposes the operator approved for this customer.
    pub approved_purposes: Vec<String>,
}

impl Default for Customer {
    fn default() -> Self {
        Customer {
            id: "cus_test".into(),
            plan: "starter".into(),
            approved_purposes: PURPOSES.iter().map(|p| p.to_string()).collect(),
        }
    }
}

/// What the instance did recently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Counters {
    /// Messages the instance sent this recipient in the last 24 hours.
    pub to_recipient_24h: u32,
    /// Messages the instance ever sent this recipient (0: a new recipient).
    pub to_recipient_total: u32,
    /// Messages the recipient ever sent the instance.
    pub replies_from_recipient: u32,
    /// Distinct recipients first messaged today (UTC).
    pub new_recipients_today: u32,
    /// Messages the instance sent today (UTC).
    pub sent_today: u32,
}

/// Everything a policy sees of one send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Context {
    pub stage: Stage,
    pub purpose: String,
    /// Body of a text message.
    pub text: Option<String>,
    /// Caption of a media message.
    pub caption: Option<String>,
    pub media: Option<Media>,
    pub recipient: Recipient,
    pub instance: Instance,
    pub customer: Customer,
    pub source: Source,
    pub counters: Counters,
}

impl Default for Context {
    fn default() -> Self {
        Context {
            stage: Stage::Content,
            purpose: "transactional".into(),
            text: None,
            caption: None,
            media: None,
            recipient: Recipient::default(),
            instance: Instance::default(),
            customer: Customer::default(),
            source: Source::Api,
            counters: Counters::default(),
        }
    }
}

impl Context {
    /// Reads a context from JSON (missing fields take their defaults).
    pub fn from_json(json: &str) -> Result<Context, String> {
        serde_json::from_str(json).map_err(|e| format!("not a policy context: {e}"))
    }
}

/// A policy's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Verdict {
    Allow,
    Deny { code: String, reason: String, risk_score: u8 },
    Review { reason: String, risk_score: u8 },
}

impl Verdict {
    /// `allow`, `deny` or `review`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny { .. } => "deny",
            Verdict::Review { .. } => "review",
        }
    }

    /// The risk score (0 for allow).
    pub fn risk_score(&self) -> u8 {
        match self {
            Verdict::Allow => 0,
            Verdict::Deny { risk_score, .. } | Verdict::Review { risk_score, .. } => *risk_score,
        }
    }

    /// The reason, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Allow => None,
            Verdict::Deny { reason, .. } | Verdict::Review { reason, .. } => Some(reason),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Allow => write!(f, "allow"),
            Verdict::Deny { code, reason, risk_score } => write!(f, "deny {code} (risk {risk_score}): {reason}"),
            Verdict::Review { reason, risk_score } => write!(f, "review (risk {risk_score}): {reason}"),
        }
    }
}

/// The decision a fixture expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expected {
    Allow,
    Deny,
    Review,
}

/// What a fixture expects of the verdict; every given field must hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub decision: Expected,
    /// The deny code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Text the reason must contain (case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_contains: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_at_least: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_at_most: Option<u8>,
}

impl Expect {
    /// `Ok` when `got` meets every expectation, else what differs.
    pub fn check(&self, got: &Verdict) -> Result<(), String> {
        let decision_ok = matches!(
            (self.decision, got),
            (Expected::Allow, Verdict::Allow)
                | (Expected::Deny, Verdict::Deny { .. })
                | (Expected::Review, Verdict::Review { .. })
        );
        let mut wrong = Vec::new();
        if !decision_ok {
            wrong.push(format!("decision {:?}", self.decision).to_lowercase());
        }
        if let Some(code) = &self.code
            && !matches!(got, Verdict::Deny { code: c, .. } if c == code)
        {
            wrong.push(format!("code {code:?}"));
        }
        if let Some(needle) = &self.reason_contains
            && !got.reason().is_some_and(|r| r.to_lowercase().contains(&needle.to_lowercase()))
        {
            wrong.push(format!("reason containing {needle:?}"));
        }
        if let Some(min) = self.risk_at_least
            && got.risk_score() < min
        {
            wrong.push(format!("risk at least {min}"));
        }
        if let Some(max) = self.risk_at_most
            && got.risk_score() > max
        {
            wrong.push(format!("risk at most {max}"));
        }
        if wrong.is_empty() { Ok(()) } else { Err(format!("expected {}, got {got}", wrong.join(", "))) }
    }
}

/// One case of a fixture file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    pub name: String,
    #[serde(default)]
    pub context: Context,
    pub expect: Expect,
    /// Most fuel the evaluation may use in the sandbox (the host's budget otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fuel: Option<u64>,
}

/// Reads a fixture file: a JSON array of fixtures.
pub fn parse_fixtures(json: &str) -> Result<Vec<Fixture>, String> {
    let fixtures: Vec<Fixture> = serde_json::from_str(json).map_err(|e| format!("not a fixture file: {e}"))?;
    if fixtures.is_empty() {
        return Err("the fixture file has no fixtures".into());
    }
    let mut names = std::collections::HashSet::new();
    for f in &fixtures {
        if !names.insert(f.name.as_str()) {
            return Err(format!("two fixtures are named {:?}", f.name));
        }
    }
    Ok(fixtures)
}

/// The result of running one fixture.
#[derive(Clone, Debug)]
pub struct FixtureResult {
    pub name: String,
    /// `Ok`, or what went wrong.
    pub outcome: Result<(), String>,
    /// Fuel used, when run in the sandbox.
    pub fuel: Option<u64>,
}

impl fmt::Display for FixtureResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fuel = self.fuel.map(|n| format!(" ({n} fuel)")).unwrap_or_default();
        match &self.outcome {
            Ok(()) => write!(f, "ok    {}{fuel}", self.name),
            Err(why) => write!(f, "FAIL  {}: {why}{fuel}", self.name),
        }
    }
}

/// The results of a fixture file.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub results: Vec<FixtureResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_ok()).count()
    }

    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// `N passed, N failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        write!(f, "{}", self.summary())
    }
}

/// Two-digit country calling codes; the other codes after 1 and 7 have three digits
/// (E.164 codes are prefix-free).
const TWO_DIGIT_CODES: [u16; 44] = [
    20, 27, 30, 31, 32, 33, 34, 36, 39, 40, 41, 43, 44, 45, 46, 47, 48, 49, 51, 52, 53, 54, 55, 56, 57, 58, 60, 61, 62,
    63, 64, 65, 66, 81, 82, 84, 86, 90, 91, 92, 93, 94, 95, 98,
];

/// The country calling code of an E.164 number (`+5511...` → 55).
pub fn country_code_of(phone: &str) -> Option<u16> {
    let digits = phone.strip_prefix('+')?;
    let prefix = |n: usize| digits.get(..n).filter(|p| p.bytes().all(|b| b.is_ascii_digit()))?.parse::<u16>().ok();
    let one = prefix(1)?;
    if one == 1 || one == 7 {
        return Some(one);
    }
    let two = prefix(2)?;
    if TWO_DIGIT_CODES.contains(&two) {
        return Some(two);
    }
    prefix(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixture_states_only_what_matters() {
        let fixtures = parse_fixtures(
            r#"[{"name": "promo", "context": {"text": "50% OFF", "recipient": {"phone": "+5511987654321"}},
                 "expect": {"decision": "deny", "code": "marketing_content", "risk_at_least": 70}}]"#,
        )
        .unwrap();
        let c = &fixtures[0].context;
        assert_eq!(c.stage, Stage::Content);
        assert_eq!(c.purpose, "transactional");
        assert_eq!(c.recipient.country_code, 55);
        assert_eq!(c.customer.approved_purposes.len(), 5);
        assert_eq!(c.instance.age_days, 30);
    }

    #[test]
    fn misspelt_fields_and_duplicate_names_are_refused() {
        let typo = r#"[{"name": "a", "context": {"txt": "x"}, "expect": {"decision": "allow"}}]"#;
        assert!(parse_fixtures(typo).unwrap_err().contains("txt"));
        let twice =
            r#"[{"name": "a", "expect": {"decision": "allow"}}, {"name": "a", "expect": {"decision": "allow"}}]"#;
        assert!(parse_fixtures(twice).is_err());
        assert!(parse_fixtures("[]").is_err());
    }

    #[test]
    fn expectations_name_what_differs() {
        let deny =
            Verdict::Deny { code: "marketing_content".into(), reason: "Promotional wording".into(), risk_score: 80 };
        let expect = |json: &str| serde_json::from_str::<Expect>(json).unwrap();
        assert!(
            expect(r#"{"decision": "deny", "code": "marketing_content", "reason_contains": "promo"}"#)
                .check(&deny)
                .is_ok()
        );
        let wrong = expect(r#"{"decision": "review", "risk_at_most": 50}"#).check(&deny).unwrap_err();
        assert!(wrong.contains("decision review") && wrong.contains("risk at most 50"), "{wrong}");
        assert!(expect(r#"{"decision": "allow"}"#).check(&Verdict::Allow).is_ok());
    }

    #[test]
    fn country_codes_are_read_off_the_number() {
        for (phone, cc) in [
            ("+14155550123", 1),
            ("+79161234567", 7),
            ("+5511987654321", 55),
            ("+971501234567", 971),
            ("+201001234567", 20),
            ("+351912345678", 351),
        ] {
            assert_eq!(country_code_of(phone), Some(cc), "{phone}");
        }
        assert_eq!(country_code_of("14155550123"), None);
    }

    #[test]
    fn verdicts_read_and_print_as_fixtures_write_them() {
        let v: Verdict =
            serde_json::from_str(r#"{"decision": "review", "reason": "uncertain", "risk_score": 50}"#).unwrap();
        assert_eq!(v, Verdict::Review { reason: "uncertain".into(), risk_score: 50 });
        assert_eq!(serde_json::to_value(&Verdict::Allow).unwrap(), serde_json::json!({"decision": "allow"}));
    }
}
