//! Evolution's webhook payloads, read into provider-neutral facts (reference §1.4 to
//! §1.6). Pure: no store, no clock; `Ingress` applies the facts.
//!
//! `date_time` of the envelope is not trusted (it is server-local time with a `Z`); a
//! message's own `messageTimestamp` and the receive time are used instead.

use serde_json::Value;

/// Who wrote a message, as the provider names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sender {
    /// `...@s.whatsapp.net`, `...@lid`, ...
    pub jid: String,
    /// The phone number behind an `@lid` id, when the payload carries it
    /// (`remoteJidAlt`, `participantAlt`, `senderPn`).
    pub alternate: Option<String>,
}

/// One fact reported by the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// A message from a contact (not from the instance itself).
    Inbound {
        external_id: String,
        sender: Sender,
        /// `...@g.us` for a group message.
        group_id: Option<String>,
        message_type: String,
        text: Option<String>,
        /// The message's own time (Unix seconds), if given.
        timestamp: Option<i64>,
    },
    /// A delivery status of a message the instance sent.
    Status { external_id: String, remote_jid: Option<String>, status: String },
    /// The connection state changed: `open`, `connecting`, `close`, `refused`.
    Connection { state: String, reason: Option<i64> },
    /// A new QR code (or the QR limit was reached: `available` false).
    Qr { available: bool, code: Option<String>, base64: Option<String> },
    /// A call: `offer`, `ringing`, `timeout`, `reject`, `accept`, `terminate`.
    Call { id: String, from: String, status: String },
    /// A group was created or changed.
    Group { group_id: String },
    /// The provider's own record of a message the instance sent (`send.message`):
    /// settles the send it belongs to when that send's outcome was unknown.
    SentEcho {
        external_id: String,
        remote_jid: String,
        /// When the provider took the message (Unix seconds), if given.
        timestamp: Option<i64>,
    },
    /// The instance was logged out at the provider.
    LoggedOut,
    /// Nothing for customers (an echo of our own send, a broadcast status, ...).
    Ignored(&'static str),
}

fn text_of(message: &Value) -> Option<String> {
    let candidates = [
        &message["conversation"],
        &message["extendedTextMessage"]["text"],
        &message["imageMessage"]["caption"],
        &message["videoMessage"]["caption"],
        &message["documentMessage"]["caption"],
    ];
    candidates.into_iter().find_map(|v| v.as_str()).map(str::to_string)
}

fn string(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The facts of one webhook post.
pub fn parse(envelope: &Value) -> Vec<Fact> {
    let event = envelope["event"].as_str().unwrap_or_default().to_ascii_lowercase().replace('_', ".");
    let data = &envelope["data"];
    match event.as_str() {
        "messages.upsert" => vec![inbound(data)],
        "messages.update" => {
            let items: Vec<&Value> = match data {
                Value::Array(items) => items.iter().collect(),
                one => vec![one],
            };
            items
                .into_iter()
                .map(|d| match (string(&d["keyId"]).or_else(|| string(&d["key"]["id"])), string(&d["status"])) {
                    (Some(external_id), Some(status)) => Fact::Status {
                        external_id,
                        remote_jid: string(&d["remoteJid"]).or_else(|| string(&d["key"]["remoteJid"])),
                        status: status.to_ascii_uppercase(),
                    },
                    _ => Fact::Ignored("status without id"),
                })
                .collect()
        }
        "connection.update" => match string(&data["state"]) {
            Some(state) => vec![Fact::Connection { state, reason: data["statusReason"].as_i64() }],
            None => vec![Fact::Ignored("connection without state")],
        },
        "qrcode.updated" => {
            let qr = &data["qrcode"];
            let code = string(&qr["code"]);
            let base64 = string(&qr["base64"]);
            vec![Fact::Qr { available: code.is_some() || base64.is_some(), code, base64 }]
        }
        "call" => match (string(&data["id"]), string(&data["callerPn"]).or_else(|| string(&data["from"]))) {
            (Some(id), Some(from)) => {
                vec![Fact::Call { id, from, status: string(&data["status"]).unwrap_or_default().to_ascii_lowercase() }]
            }
            _ => vec![Fact::Ignored("call without id")],
        },
        "groups.upsert" | "groups.update" => match data {
            Value::Array(items) => {
                items.iter().filter_map(|g| string(&g["id"])).map(|group_id| Fact::Group { group_id }).collect()
            }
            other => string(&other["id"]).map(|group_id| Fact::Group { group_id }).into_iter().collect(),
        },
        "group-participants.update" | "group.participants.update" => {
            string(&data["id"]).map(|group_id| Fact::Group { group_id }).into_iter().collect()
        }
        "logout.instance" => vec![Fact::LoggedOut],
        "status.instance" if data["status"] == "closed" => vec![Fact::LoggedOut],
        "send.message" => match (string(&data["key"]["id"]), string(&data["key"]["remoteJid"])) {
            (Some(external_id), Some(remote_jid)) => {
                let timestamp = seconds(&data["messageTimestamp"]);
                vec![Fact::SentEcho { external_id, remote_jid, timestamp }]
            }
            _ => vec![Fact::Ignored("echo without id")],
        },
        _ => vec![Fact::Ignored("event not used")],
    }
}

/// A time in Unix seconds, as a number or a string of digits.
fn seconds(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn inbound(data: &Value) -> Fact {
    let key = &data["key"];
    let Some(remote) = string(&key["remoteJid"]) else {
        return Fact::Ignored("message without sender");
    };
    if key["fromMe"] == true {
        return Fact::Ignored("sent by the instance");
    }
    if remote == "status@broadcast" {
        return Fact::Ignored("status broadcast");
    }
    let Some(external_id) = string(&key["id"]) else {
        return Fact::Ignored("message without id");
    };
    let (sender_jid, alternate, group_id) = if remote.ends_with("@g.us") {
        let participant = string(&key["participant"]).unwrap_or_default();
        (participant, string(&key["participantAlt"]).or_else(|| string(&key["participantPn"])), Some(remote))
    } else {
        (remote, string(&key["remoteJidAlt"]).or_else(|| string(&key["senderPn"])), None)
    };
    Fact::Inbound {
        external_id,
        sender: Sender { jid: sender_jid, alternate },
        group_id,
        message_type: string(&data["messageType"]).unwrap_or_else(|| "conversation".into()),
        text: text_of(&data["message"]),
        timestamp: data["messageTimestamp"].as_i64(),
    }
}

/// `+` and the digits of a phone jid (`5511...@s.whatsapp.net`), if it is one.
pub fn phone_of(jid: &str) -> Option<String> {
    let (user, server) = jid.split_once('@')?;
    let user = user.split(':').next().unwrap_or(user);
    (server == "s.whatsapp.net" && !user.is_empty() && user.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("+{user}"))
}

/// How far along a status is; a message's status never moves back.
pub fn status_rank(status: &str) -> i64 {
    match status {
        "PENDING" => 0,
        "ERROR" | "SERVER_ACK" => 1,
        "DELIVERY_ACK" => 2,
        "READ" => 3,
        "PLAYED" => 4,
        _ => 5,
    }
}

/// An inbound text that is exactly an opt-out or opt-in keyword (case, accents and
/// surrounding space ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyword {
    OptOut,
    OptIn,
}

/// Opt-out keywords: STOP and its usual translations, the carriers' usual extras, and Arabic.
pub const OPT_OUT: [&str; 16] = [
    "STOP",
    "UNSUBSCRIBE",
    "CANCEL",
    "END",
    "QUIT",
    "STOPALL",
    "OPTOUT",
    "REVOKE",
    "PARAR",
    "SAIR",
    "CANCELAR",
    "BAJA",
    "توقف",
    "الغاء",
    "إلغاء",
    "ايقاف",
];
pub const OPT_IN: [&str; 5] = ["START", "UNSTOP", "ALTA", "VOLTAR", "ابدأ"];

/// The keyword an inbound text is, if any.
pub fn keyword(text: &str) -> Option<Keyword> {
    let folded: String = fold(text.trim());
    if OPT_OUT.iter().any(|k| fold(k) == folded) {
        Some(Keyword::OptOut)
    } else if OPT_IN.iter().any(|k| fold(k) == folded) {
        Some(Keyword::OptIn)
    } else {
        None
    }
}

/// Upper case without Latin accents; Arabic hamza forms of alef folded to bare alef.
fn fold(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'á' | 'à' | 'â' | 'ã' | 'ä' | 'Á' | 'À' | 'Â' | 'Ã' | 'Ä' => 'A',
            'é' | 'è' | 'ê' | 'ë' | 'É' | 'È' | 'Ê' | 'Ë' => 'E',
            'í' | 'ì' | 'î' | 'ï' | 'Í' | 'Ì' | 'Î' | 'Ï' => 'I',
            'ó' | 'ò' | 'ô' | 'õ' | 'ö' | 'Ó' | 'Ò' | 'Ô' | 'Õ' | 'Ö' => 'O',
            'ú' | 'ù' | 'û' | 'ü' | 'Ú' | 'Ù' | 'Û' | 'Ü' => 'U',
            'ç' | 'Ç' => 'C',
            'ñ' | 'Ñ' => 'N',
            'أ' | 'إ' | 'آ' => 'ا',
            other => other.to_ascii_uppercase(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_inbound_text_from_a_phone() {
        let env = json!({"event": "messages.upsert", "instance": "x", "data": {
            "key": {"remoteJid": "558197088404@s.whatsapp.net", "fromMe": false, "id": "3AE99D6A1DBF3F9A0578"},
            "pushName": "Nome", "status": "DELIVERY_ACK", "message": {"conversation": "Texto da mensagem"},
            "messageType": "conversation", "messageTimestamp": 1763771103, "instanceId": "uuid", "source": "ios"},
            "date_time": "2025-11-21T21:25:03.966Z", "sender": "558196349077@s.whatsapp.net"});
        let facts = parse(&env);
        assert_eq!(
            facts,
            vec![Fact::Inbound {
                external_id: "3AE99D6A1DBF3F9A0578".into(),
                sender: Sender { jid: "558197088404@s.whatsapp.net".into(), alternate: None },
                group_id: None,
                message_type: "conversation".into(),
                text: Some("Texto da mensagem".into()),
                timestamp: Some(1763771103),
            }]
        );
        assert_eq!(phone_of("558197088404@s.whatsapp.net").as_deref(), Some("+558197088404"));
        assert_eq!(phone_of("558197088404:12@s.whatsapp.net").as_deref(), Some("+558197088404"));
        assert_eq!(phone_of("13718@lid"), None);
    }

    #[test]
    fn own_messages_broadcasts_and_echoes_are_ignored() {
        let mine = json!({"event": "messages.upsert", "data": {"key": {"remoteJid": "55@s.whatsapp.net", "fromMe": true, "id": "A"}}});
        assert_eq!(parse(&mine), vec![Fact::Ignored("sent by the instance")]);
        let broadcast = json!({"event": "messages.upsert", "data": {"key": {"remoteJid": "status@broadcast", "fromMe": false, "id": "A"}}});
        assert_eq!(parse(&broadcast), vec![Fact::Ignored("status broadcast")]);
        assert_eq!(parse(&json!({"event": "send.message", "data": {}})), vec![Fact::Ignored("echo without id")]);
        assert_eq!(
            parse(&json!({"event": "MESSAGES_UPSERT", "data": {}})),
            vec![Fact::Ignored("message without sender")]
        );
    }

    #[test]
    fn an_echo_of_a_send_carries_its_id_recipient_and_time() {
        let echo = |ts: Value| {
            json!({"event": "send.message", "data": {"key": {"remoteJid": "5511999990009@s.whatsapp.net",
                   "fromMe": true, "id": "BAE5"}, "messageTimestamp": ts}})
        };
        let fact = |timestamp| Fact::SentEcho {
            external_id: "BAE5".into(),
            remote_jid: "5511999990009@s.whatsapp.net".into(),
            timestamp,
        };
        assert_eq!(parse(&echo(json!(1_700_000_000))), vec![fact(Some(1_700_000_000))]);
        assert_eq!(parse(&echo(json!("1700000000"))), vec![fact(Some(1_700_000_000))]);
        assert_eq!(parse(&echo(Value::Null)), vec![fact(None)]);
    }

    #[test]
    fn keywords_ignore_case_accents_and_space() {
        for text in
            ["STOP", " stop ", "Stop", "baja", "Cancelar", "sair", "PARAR", "توقف", "الغاء", "إلغاء", "  إلغاء  "]
        {
            assert_eq!(keyword(text), Some(Keyword::OptOut), "{text}");
        }
        for text in ["start", "UNSTOP", "alta"] {
            assert_eq!(keyword(text), Some(Keyword::OptIn), "{text}");
        }
        for text in ["stop please", "STOP!", "stopped", "", "please don't stop"] {
            assert_eq!(keyword(text), None, "{text}");
        }
        assert_eq!(keyword("CÂNCEL"), Some(Keyword::OptOut), "accents folded");
    }

    #[test]
    fn statuses_rank_forward_only() {
        assert!(status_rank("READ") > status_rank("DELIVERY_ACK"));
        assert!(status_rank("DELIVERY_ACK") > status_rank("SERVER_ACK"));
        assert!(status_rank("PLAYED") > status_rank("READ"));
    }
}
