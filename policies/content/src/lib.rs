//! The default content policy: refuses marketing, promotional, cold-outreach and
//! political wording and bulk-campaign signs, in English, Spanish, Portuguese and
//! Arabic, with a risk score; the uncertain band goes to review. Asked at the content
//! stage; a denial is 403 `policy_violation`.
//!
//! How it reads a message: the text (or caption) is lowercased, Latin accents and
//! Arabic diacritics and letter variants are folded, and it is split into words. Each
//! position is looked up against a sorted table of phrases of up to six words
//! ([`signals`]; the longest match at a position wins and the words it covers are not
//! counted again), so one evaluation is a few hundred binary searches, not a scan per
//! phrase. Each distinct phrase counts once.
//!
//! Scores (see `gen_signals.py` for every phrase and weight):
//! - promotional wording (`% off`, `promo code`, `descuento`, `desconto`, `خصم`) and
//!   calls to buy (`buy now`, `use code`, `compre agora`); a message with a
//!   transactional anchor (`your order`, `invoice`, `was applied`, `seu pedido`,
//!   `طلبك`) and no call to buy counts its promotional wording at half: an order update
//!   may mention the discount already granted;
//! - cold outreach (`we came across your`, `grow your business`);
//! - political campaigning (`vote for`, `our candidate`, `reeleição`: 70, a denial on
//!   its own), political words (`candidate`, `rally`: 25), and election words
//!   (`ballot`, `polling station`: 5, at most 15 in all), so an election office's
//!   notice to its own staff passes;
//! - bulk-campaign signs (`reply stop to`, `dear valued customer`, unfilled
//!   `{{placeholders}}`);
//! - URL shorteners (45): links that hide where they go;
//! - shouting (mostly capitals, `!!!`) adds 10 to promotional wording, never alone.
//!
//! Internal-team messages count promotional and outreach wording at half (staff talk
//! about their own sales); authentication messages add 20 to any promotional wording
//! (a code must not carry an offer). Risk is the sum, at most 100: [`DENY_AT`] and
//! above is denied with the strongest category's code, [`REVIEW_AT`] and above is
//! sent to review.

use gateway_policy::{Decision, MessageContext, Policy, Stage, export_policy};

pub mod signals;

/// Risk from which a message is denied.
pub const DENY_AT: u32 = 70;
/// Risk from which a message goes to review.
pub const REVIEW_AT: u32 = 40;
/// Weight of a URL shortener.
pub const SHORTENER_WEIGHT: u32 = 45;

/// Known URL shorteners.
pub const SHORTENERS: [&str; 17] = [
    "bit.ly",
    "tinyurl.com",
    "t.co",
    "goo.gl",
    "ow.ly",
    "is.gd",
    "buff.ly",
    "rebrand.ly",
    "cutt.ly",
    "shorturl.at",
    "rb.gy",
    "tiny.cc",
    "s.id",
    "bl.ink",
    "t.ly",
    "v.gd",
    "shorte.st",
];

/// What a phrase is a sign of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Promo,
    CallToBuy,
    Outreach,
    Political,
    Civic,
    Bulk,
    Anchor,
}

/// The content rules.
pub struct ContentPolicy;

impl Policy for ContentPolicy {
    fn evaluate(ctx: MessageContext) -> Decision {
        if ctx.stage != Stage::Content {
            return Decision::Allow;
        }
        decide(ctx.body(), &ctx.purpose)
    }
}

export_policy!(ContentPolicy, name = "content", stages = "content", reads_counters = false);

/// What was found in a message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub promo: u32,
    pub call_to_buy: u32,
    pub outreach: u32,
    pub political: u32,
    pub civic: u32,
    pub bulk: u32,
    pub anchors: u32,
    pub shortener: Option<String>,
    pub shouting: bool,
    /// The phrases that counted, in order.
    pub phrases: Vec<String>,
}

/// The decision for a message body and purpose (plain function, tested natively).
pub fn decide(body: &str, purpose: &str) -> Decision {
    let f = findings(body);
    let mut promo = f.promo + f.call_to_buy;
    if f.anchors > 0 && f.call_to_buy == 0 {
        promo /= 2;
    }
    if promo > 0 && f.shouting {
        promo += 10;
    }
    let mut outreach = f.outreach;
    match purpose {
        "internal_team" => {
            promo /= 2;
            outreach /= 2;
        }
        "authentication" if promo + outreach > 0 => promo += 20,
        _ => {}
    }
    let political = f.political + f.civic.min(15);
    let shortener = if f.shortener.is_some() { SHORTENER_WEIGHT } else { 0 };
    let risk = (promo + outreach + political + f.bulk + shortener).min(100);
    if risk < REVIEW_AT {
        return Decision::Allow;
    }
    let (code, what) = [
        (promo, "marketing_content", "promotional wording"),
        (outreach, "cold_outreach", "cold-outreach wording"),
        (political, "political_content", "political campaigning"),
        (f.bulk, "bulk_campaign", "bulk-campaign signs"),
        (shortener, "url_shortener", "a shortened link"),
    ]
    .into_iter()
    .max_by_key(|(score, ..)| *score)
    .map(|(_, code, what)| (code, what))
    .unwrap_or(("marketing_content", "promotional wording"));
    let mut found: Vec<String> = f.phrases.iter().take(4).map(|p| format!("\"{p}\"")).collect();
    if let Some(s) = &f.shortener {
        found.push(format!("link via {s}"));
    }
    let found = found.join(", ");
    if risk >= DENY_AT {
        Decision::deny(
            code,
            format!(
                "{what} ({found}) is not allowed: this gateway sends transactional, operational, support, \
                 internal-team and authentication messages only"
            ),
            risk as u8,
        )
    } else {
        Decision::review(format!("possibly {what} ({found}); held for a responsible-messaging review"), risk as u8)
    }
}

/// Reads the signs in a message.
pub fn findings(body: &str) -> Findings {
    let mut f = Findings::default();
    let scan = scan(body);
    let (norm, words) = (&scan.norm, &scan.words);
    let mut covered_until = 0;
    let mut seen: Vec<&str> = Vec::new();
    for i in 0..words.len() {
        let first = fnv1a(FNV_START, &norm[words[i].0..words[i].1]);
        if !starts_a_phrase(first) {
            continue;
        }
        // Each longer phrase's hash continues the shorter one's; the longest match wins.
        let mut best = None;
        let mut hash = first;
        for n in 1..=signals::LONGEST.min(words.len() - i) {
            let end = i + n;
            if n > 1 {
                hash = fnv1a(hash, &norm[words[end - 2].1..words[end - 1].1]);
            }
            if let Some(entry) = phrase(hash)
                && entry.1.as_bytes() == &norm[words[i].0..words[end - 1].1]
            {
                best = Some((end, entry));
            }
        }
        let Some((end, (_, phrase, category, weight))) = best else {
            continue;
        };
        if end <= covered_until || seen.contains(&phrase) {
            continue;
        }
        covered_until = end;
        seen.push(phrase);
        let weight = u32::from(weight);
        match category {
            Category::Promo => f.promo += weight,
            Category::CallToBuy => f.call_to_buy += weight,
            Category::Outreach => f.outreach += weight,
            Category::Political => f.political += weight,
            Category::Civic => f.civic += weight,
            Category::Bulk => f.bulk += weight,
            Category::Anchor => f.anchors += 1,
        }
        if category != Category::Anchor && category != Category::Civic {
            f.phrases.push(phrase.to_string());
        }
    }
    if scan.bracket && has_placeholder(body) {
        f.bulk += 30;
        f.phrases.push("an unfilled {{placeholder}}".into());
    }
    if scan.dot {
        f.shortener = shortener(body);
    }
    // Mostly capital letters (at least 20 letters, over 70 % capitals), or `!!!`.
    f.shouting = (scan.letters >= 20 && scan.upper * 10 > scan.letters * 7) || scan.longest_bang_run >= 3;
    f
}

const FNV_START: u64 = 0xcbf29ce484222325;

/// Whether some phrase starts with the word of this hash.
fn starts_a_phrase(hash: u64) -> bool {
    let mut i = hash as usize % signals::SLOTS;
    loop {
        match signals::START_SLOTS[i] {
            0 => return false,
            h if h == hash => return true,
            _ => i = (i + 1) % signals::SLOTS,
        }
    }
}

/// The phrase with this hash, if any (the caller compares the words).
fn phrase(hash: u64) -> Option<(u64, &'static str, Category, u8)> {
    let mut i = hash as usize % signals::SLOTS;
    loop {
        match signals::PHRASE_SLOTS[i] {
            (0, _) => return None,
            (h, index) if h == hash => return Some(signals::PHRASES[index as usize - 1]),
            _ => i = (i + 1) % signals::SLOTS,
        }
    }
}

/// FNV-1a over `bytes`, continuing from `hash` (`FNV_START` to begin).
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    hash
}

/// One pass over a message: its normalised words, and what the other checks need.
#[derive(Debug, Default)]
pub struct Scan {
    /// The words, lowercased and folded, joined by single spaces (UTF-8).
    pub norm: Vec<u8>,
    /// Each word's byte range in `norm`.
    pub words: Vec<(usize, usize)>,
    upper: usize,
    letters: usize,
    longest_bang_run: usize,
    /// A `.` inside a word (a link may be there); a `{`, `[` or `%` (a placeholder
    /// may be there).
    dot: bool,
    bracket: bool,
}

/// What an ASCII byte is to the scan.
const SEP: u8 = 0;
const LOWER: u8 = 1;
const DIGIT: u8 = 2;
const UPPER: u8 = 3;
const DOT: u8 = 4;
const BRACKET: u8 = 5;
const PERCENT: u8 = 6;
const BANG: u8 = 7;

static ASCII: [u8; 128] = {
    let mut t = [SEP; 128];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            b'a'..=b'z' => LOWER,
            b'0'..=b'9' => DIGIT,
            b'A'..=b'Z' => UPPER,
            b'.' => DOT,
            b'{' | b'[' => BRACKET,
            b'%' => PERCENT,
            b'!' => BANG,
            _ => SEP,
        };
        b += 1;
    }
    t
};

impl Scan {
    /// Starts a word at the current end (after a space) unless one is open.
    fn open(&mut self, start: &mut Option<usize>) {
        if start.is_none() {
            if !self.norm.is_empty() {
                self.norm.push(b' ');
            }
            *start = Some(self.norm.len());
        }
    }

    fn close(&mut self, start: &mut Option<usize>) {
        if let Some(s) = start.take() {
            self.words.push((s, self.norm.len()));
        }
    }

    /// `%` is a word of its own ("50 % off").
    fn percent(&mut self, start: &mut Option<usize>) {
        self.close(start);
        if !self.norm.is_empty() {
            self.norm.push(b' ');
        }
        self.words.push((self.norm.len(), self.norm.len() + 1));
        self.norm.push(b'%');
    }

    /// The normalised text (tests and reasons).
    pub fn norm_str(&self) -> &str {
        std::str::from_utf8(&self.norm).unwrap_or_default()
    }
}

/// Reads a message once: ASCII bytes through a table, other characters lowercased
/// and folded.
pub fn scan(body: &str) -> Scan {
    let mut s = Scan {
        norm: Vec::with_capacity(body.len() + 8),
        words: Vec::with_capacity(body.len() / 4 + 1),
        ..Scan::default()
    };
    let bytes = body.as_bytes();
    let mut start = None;
    let mut bangs = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            i += 1;
            let class = ASCII[b as usize];
            if class == BANG {
                bangs += 1;
                s.longest_bang_run = s.longest_bang_run.max(bangs);
            } else {
                bangs = 0;
            }
            match class {
                LOWER | DIGIT | UPPER => {
                    // The whole run of ASCII letters and digits in one loop; `| 0x20`
                    // lowercases a letter and leaves a digit as it is.
                    s.open(&mut start);
                    let mut c = b;
                    let mut class = class;
                    loop {
                        s.letters += usize::from(class != DIGIT);
                        s.upper += usize::from(class == UPPER);
                        s.norm.push(c | 0x20);
                        match bytes.get(i) {
                            Some(&n) if n < 0x80 && ASCII[n as usize].wrapping_sub(LOWER) < 3 => {
                                c = n;
                                class = ASCII[n as usize];
                                i += 1;
                            }
                            _ => break,
                        }
                    }
                }
                PERCENT => {
                    s.bracket = true;
                    s.percent(&mut start);
                }
                _ => {
                    // A dot inside a word ("bit.ly/x", "example.com"), not a full stop.
                    s.dot |= class == DOT
                        && start.is_some()
                        && bytes
                            .get(i)
                            .is_some_and(|&n| n < 0x80 && matches!(ASCII[n as usize], LOWER | DIGIT | UPPER));
                    s.bracket |= class == BRACKET;
                    s.close(&mut start);
                }
            }
            continue;
        }
        bangs = 0;
        let raw = body[i..].chars().next().unwrap_or(' ');
        i += raw.len_utf8();
        let mut lowered = ['\0'; 3];
        let n = if ('\u{0600}'..='\u{06FF}').contains(&raw) {
            // Arabic has no case.
            lowered[0] = raw;
            1
        } else {
            s.upper += usize::from(raw.is_uppercase());
            s.letters += usize::from(raw.is_alphabetic());
            let mut n = 0;
            for l in raw.to_lowercase() {
                lowered[n] = l;
                n += 1;
            }
            n
        };
        for &c in &lowered[..n] {
            match fold(c) {
                None => {}
                Some('%') => s.percent(&mut start),
                Some(c) if is_word_char(c) => {
                    s.open(&mut start);
                    let mut buf = [0u8; 4];
                    s.norm.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Some(_) => s.close(&mut start),
            }
        }
    }
    s.close(&mut start);
    s
}

/// The message folded and split: the normalised text (words joined by single spaces)
/// and each word's byte range in it.
pub fn normalize(body: &str) -> (String, Vec<(usize, usize)>) {
    let s = scan(body);
    (s.norm_str().to_string(), s.words)
}

/// A letter or digit (ASCII and Arabic without the Unicode tables).
fn is_word_char(c: char) -> bool {
    match c {
        'a'..='z' | '0'..='9' => true,
        '\0'..='\u{7f}' => false,
        '\u{0621}'..='\u{064A}' | '\u{0660}'..='\u{0669}' | '\u{066E}'..='\u{06D3}' => true,
        '\u{0600}'..='\u{06FF}' => false,
        other => other.is_alphanumeric(),
    }
}

/// One lowercase character with Latin accents and Arabic diacritics and letter
/// variants folded; `None` drops it (a diacritic or tatweel).
fn fold(c: char) -> Option<char> {
    Some(match c {
        'á' | 'à' | 'â' | 'ã' | 'ä' | 'å' => 'a',
        'é' | 'è' | 'ê' | 'ë' => 'e',
        'í' | 'ì' | 'î' | 'ï' => 'i',
        'ó' | 'ò' | 'ô' | 'õ' | 'ö' => 'o',
        'ú' | 'ù' | 'û' | 'ü' => 'u',
        'ñ' => 'n',
        'ç' => 'c',
        '\u{064B}'..='\u{065F}' | '\u{0670}' | '\u{0640}' => return None,
        'أ' | 'إ' | 'آ' => 'ا',
        'ى' | 'ئ' => 'ي',
        'ة' => 'ه',
        'ؤ' => 'و',
        other => other,
    })
}

/// A template placeholder nobody filled in: `{{name}}`, `{first_name}`, `[NAME]`,
/// `%name%`.
fn has_placeholder(body: &str) -> bool {
    if body.contains("{{") && body.contains("}}") {
        return true;
    }
    let lower = body.to_ascii_lowercase();
    ["{first_name}", "{name}", "[name]", "[first name]", "%name%", "%first_name%", "{nome}", "{nombre}"]
        .iter()
        .any(|p| lower.contains(p))
}

/// The shortener a link in the message goes through, if any.
fn shortener(body: &str) -> Option<String> {
    body.split_whitespace().filter(|w| w.contains('.')).find_map(|word| {
        let lower = word.to_ascii_lowercase();
        let rest = lower.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        let rest = rest.strip_prefix("https://").or_else(|| rest.strip_prefix("http://")).unwrap_or(rest);
        let rest = rest.strip_prefix("www.").unwrap_or(rest);
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host = host.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        let has_path = rest.len() > host.len() + 1;
        SHORTENERS.iter().find(|s| host == **s && (has_path || lower.contains("://"))).map(|s| s.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_policy::testing;

    #[test]
    fn fixtures() {
        testing::assert_fixtures::<ContentPolicy>("fixtures.json");
    }

    #[test]
    fn the_phrase_tables_match_their_phrases() {
        assert!(signals::PHRASES.windows(2).all(|p| p[0].0 < p[1].0), "sorted by hash: run gen_signals.py");
        for (hash, text, ..) in signals::PHRASES {
            assert_eq!(normalize(text).0, *text, "{text:?} is not normalised: run gen_signals.py");
            assert_eq!(fnv1a(FNV_START, text.as_bytes()), *hash, "{text:?}: run gen_signals.py");
            assert_eq!(phrase(*hash).map(|p| p.1), Some(*text), "{text:?} is in its slot");
            let first = text.split(' ').next().unwrap();
            assert!(starts_a_phrase(fnv1a(FNV_START, first.as_bytes())), "{text:?}");
            assert!(text.split(' ').count() <= signals::LONGEST);
        }
        let used = signals::PHRASE_SLOTS.iter().filter(|(h, _)| *h != 0).count();
        assert_eq!(used, signals::PHRASES.len());
        assert!(!starts_a_phrase(fnv1a(FNV_START, b"shipped")) || phrase(fnv1a(FNV_START, b"shipped")).is_some());
    }

    #[test]
    fn normalisation_folds_accents_and_arabic_variants() {
        assert_eq!(normalize("¡PROMOÇÃO: 50% OFF!").0, "promocao 50 % off");
        assert_eq!(normalize("اشترِ الآن").0, "اشتر الان");
        assert_eq!(normalize("  a  --  b ").0, "a b");
        assert_eq!(normalize("").1, vec![]);
    }

    #[test]
    fn a_longer_phrase_is_counted_once_not_again_for_its_words() {
        let f = findings("Use our promo code today");
        assert_eq!(f.promo, 30, "{f:?}");
        assert_eq!(f.phrases, vec!["promo code"]);
        assert_eq!(findings("sale sale SALE").promo, 20);
    }

    #[test]
    fn shorteners_need_a_link_not_a_word() {
        assert_eq!(shortener("see https://bit.ly/3xYz now").as_deref(), Some("bit.ly"));
        assert_eq!(shortener("(tinyurl.com/abc)").as_deref(), Some("tinyurl.com"));
        assert_eq!(shortener("the t.co domain"), None);
        assert_eq!(shortener("https://example.com/bit.ly"), None);
    }
}
