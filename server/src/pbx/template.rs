//! Message templates of PBX events: `{{customer_phone}}`, `{{agent_extension}}`,
//! `{{queue}}`, `{{call_time}}` and `{{business_name}}` (spaces inside the braces
//! allowed). Anything else in double braces is refused when the template is saved, so
//! a rendered message never shows a placeholder to the caller.

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 5] = ["customer_phone", "agent_extension", "queue", "call_time", "business_name"];

/// Longest template text.
pub const MAX_TEMPLATE_CHARS: usize = 2000;

/// Values for one rendering; a missing value renders as empty text.
#[derive(Clone, Debug, Default)]
pub struct Values<'a> {
    pub customer_phone: Option<&'a str>,
    pub agent_extension: Option<&'a str>,
    pub queue: Option<&'a str>,
    pub call_time: Option<&'a str>,
    pub business_name: Option<&'a str>,
}

impl Values<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        match name {
            "customer_phone" => self.customer_phone,
            "agent_extension" => self.agent_extension,
            "queue" => self.queue,
            "call_time" => self.call_time,
            "business_name" => self.business_name,
            _ => None,
        }
    }
}

/// Splits a template into text and placeholder names.
fn parts(template: &str) -> impl Iterator<Item = Result<&str, &str>> {
    let mut rest = template;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.find("{{") {
            Some(0) => match rest[2..].find("}}") {
                Some(end) => {
                    let name = rest[2..2 + end].trim();
                    rest = &rest[2 + end + 2..];
                    Some(Err(name))
                }
                None => {
                    let text = rest;
                    rest = "";
                    Some(Ok(text))
                }
            },
            Some(start) => {
                let text = &rest[..start];
                rest = &rest[start..];
                Some(Ok(text))
            }
            None => {
                let text = rest;
                rest = "";
                Some(Ok(text))
            }
        }
    })
}

/// Checks a template before it is saved.
pub fn check(template: &str) -> Result<(), String> {
    if template.trim().is_empty() {
        return Err("the template text must not be empty".into());
    }
    if template.chars().count() > MAX_TEMPLATE_CHARS {
        return Err(format!("the template is longer than {MAX_TEMPLATE_CHARS} characters"));
    }
    for part in parts(template) {
        if let Err(name) = part
            && !PLACEHOLDERS.contains(&name)
        {
            return Err(format!("unknown placeholder {{{{{name}}}}}; use one of {}", PLACEHOLDERS.join(", ")));
        }
    }
    Ok(())
}

/// Renders a (checked) template.
pub fn render(template: &str, values: &Values<'_>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    for part in parts(template) {
        match part {
            Ok(text) => out.push_str(text),
            Err(name) => out.push_str(values.get(name).unwrap_or("")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_placeholder() {
        let values = Values {
            customer_phone: Some("+14155550123"),
            agent_extension: Some("101"),
            queue: Some("Sales"),
            call_time: Some("2026-11-21T10:00:00Z"),
            business_name: Some("Acme"),
        };
        let t = "{{business_name}}: we missed your call from {{ customer_phone }} at {{call_time}} \
                 ({{queue}}, ext {{agent_extension}}).";
        check(t).unwrap();
        assert_eq!(
            render(t, &values),
            "Acme: we missed your call from +14155550123 at 2026-11-21T10:00:00Z (Sales, ext 101)."
        );
        assert_eq!(render("Hi {{queue}}!", &Values::default()), "Hi !");
        assert_eq!(render("no placeholders", &Values::default()), "no placeholders");
        assert_eq!(render("{ single } and {{ unclosed", &Values::default()), "{ single } and {{ unclosed");
    }

    #[test]
    fn unknown_placeholders_and_empty_templates_are_refused() {
        assert!(check("Hello {{name}}").unwrap_err().contains("unknown placeholder {{name}}"));
        assert!(check("   ").is_err());
        assert!(check(&"x".repeat(MAX_TEMPLATE_CHARS + 1)).is_err());
        assert!(check("Call us back at {{ business_name }}").is_ok());
    }

    #[test]
    fn a_value_is_inserted_literally() {
        // A value that looks like a placeholder is not expanded again.
        let values = Values { queue: Some("{{business_name}}"), business_name: Some("Acme"), ..Values::default() };
        assert_eq!(render("{{queue}}", &values), "{{business_name}}");
    }
}
