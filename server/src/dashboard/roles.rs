//! Roles and what each may do: the one table every handler asks (and docs/dashboard.md's
//! table is checked against it by a test).
//!
//! Customer side: owner, admin, developer, viewer. Viewers read everything of their
//! customer and change nothing; only owners and admins manage users and API keys (and
//! the PBX secrets, which are keys too); developers configure instances, webhooks,
//! suppressions and the PBX, and make test sends. Only an owner makes or changes owners.
//! Service side: operator, who works the console and has no customer pages.

/// A dashboard role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Owner,
    Admin,
    Developer,
    Viewer,
    Operator,
}

impl Role {
    /// The four customer roles, most powerful first.
    pub const CUSTOMER: [Role; 4] = [Role::Owner, Role::Admin, Role::Developer, Role::Viewer];

    /// Parses a stored or typed role name.
    pub fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "owner" => Role::Owner,
            "admin" => Role::Admin,
            "developer" => Role::Developer,
            "viewer" => Role::Viewer,
            "operator" => Role::Operator,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Developer => "developer",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// Whether this role may do `action`.
    pub fn may(self, action: Action) -> bool {
        use Action::*;
        use Role::*;
        match (self, action) {
            (Operator, Operate) => true,
            (Operator, _) | (_, Operate) => false,
            (_, Read) => true,
            (Owner | Admin, _) => true,
            (Developer, PairInstance | ConfigureWebhook | TestSend | ManageSuppressions | ConfigurePbx) => true,
            (Developer | Viewer, _) => false,
        }
    }

    /// Whether this role may give `target` to someone, or change or remove someone who
    /// has `target` (owners alone handle owners).
    pub fn may_manage_role(self, target: Role) -> bool {
        match self {
            Role::Owner => target != Role::Operator,
            Role::Admin => matches!(target, Role::Admin | Role::Developer | Role::Viewer),
            _ => false,
        }
    }
}

/// Something a signed-in person does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// See the customer's pages (instances, logs, usage, keys' prefixes, users, ...).
    Read,
    /// Create instances.
    CreateInstance,
    /// Pair, reconnect or log out an instance.
    PairInstance,
    /// Set an instance's webhook, rotate its secret, resend and test deliveries.
    ConfigureWebhook,
    /// Send test messages from the instance page.
    TestSend,
    /// Add, remove and import suppressed recipients.
    ManageSuppressions,
    /// Change PBX settings and templates.
    ConfigurePbx,
    /// Create PBX integrations and rotate their secrets.
    ManagePbxSecrets,
    /// Create and revoke API keys.
    ManageKeys,
    /// Invite users, change roles, remove users.
    ManageUsers,
    /// The operator console.
    Operate,
}

impl Action {
    /// Every action, in the order of the table in docs/dashboard.md, with its description there.
    pub const ALL: [(Action, &'static str); 11] = [
        (Action::Read, "see instances, message log, inbound messages, usage, keys (prefixes), users"),
        (Action::CreateInstance, "create instances"),
        (Action::PairInstance, "pair, reconnect or log out an instance"),
        (Action::ConfigureWebhook, "configure webhooks, resend deliveries, send test events"),
        (Action::TestSend, "send test messages"),
        (Action::ManageSuppressions, "add, remove, import suppressed recipients"),
        (Action::ConfigurePbx, "change PBX settings and templates"),
        (Action::ManagePbxSecrets, "create PBX integrations, rotate their secrets"),
        (Action::ManageKeys, "create and revoke API keys"),
        (Action::ManageUsers, "invite users, change roles, remove users"),
        (
            Action::Operate,
            "operator console: approve plans, pause and resume, raise limits, review queue, policy modules",
        ),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewers_change_nothing_and_operators_have_no_customer_pages() {
        for (action, _) in Action::ALL {
            assert_eq!(Role::Viewer.may(action), action == Action::Read, "viewer {action:?}");
            assert_eq!(Role::Operator.may(action), action == Action::Operate, "operator {action:?}");
        }
        for role in Role::CUSTOMER {
            assert!(!role.may(Action::Operate));
            assert_eq!(role.may(Action::ManageKeys), matches!(role, Role::Owner | Role::Admin));
            assert_eq!(role.may(Action::ManageUsers), matches!(role, Role::Owner | Role::Admin));
        }
        assert!(!Role::Admin.may_manage_role(Role::Owner));
        assert!(Role::Owner.may_manage_role(Role::Owner));
        assert!(!Role::Developer.may_manage_role(Role::Viewer));
    }

    /// The table in docs/dashboard.md of who may do what says what this module does.
    #[test]
    fn documented_role_table_matches() {
        let doc = include_str!("../../../docs/dashboard.md");
        for (action, description) in Action::ALL {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| {description} |")))
                .unwrap_or_else(|| panic!("docs/dashboard.md has no row for {description:?}"));
            let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).skip(1).collect();
            let roles = [Role::Owner, Role::Admin, Role::Developer, Role::Viewer, Role::Operator];
            assert_eq!(cells.len(), roles.len(), "{row}");
            for (role, cell) in roles.iter().zip(cells) {
                assert_eq!(
                    cell == "yes",
                    role.may(action),
                    "docs/dashboard.md says {cell:?} for {role:?} / {description}"
                );
            }
        }
    }
}
