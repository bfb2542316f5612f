//! ACL tokens: who may drive a cluster started with `cube manager --acl`, and as what.
//!
//! A token is written `cube.<ID>.<SECRET>`: the ID (16 hex digits) names its record in the
//! manager's store and may be shown (`cube token list`); the secret (64 hex digits, 256 random
//! bits) is shown once, when the token is made, and only its SHA-256 is kept. The hashing and
//! the randomness live in the manager; this file holds the nouns and the wire names.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a token may do. `Read` < `Submit` < `Operator` < `Management` each allow what the one
/// before allows and more; `Node` stands apart: it only registers and reports as one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every `GET` but logs, exec and the store's backup.
    Read,
    /// Also run, stop, scale, logs and exec of tasks and jobs.
    Submit,
    /// Also nodes: drain, eligibility, removal.
    Operator,
    /// Also tokens, and the store's backup.
    Management,
    /// A join token: registration and heartbeats of the one node it joined as.
    Node,
    /// `cube router`'s: the routes of every project (`GET /routes`), nothing else. Every
    /// role of the chain may read the routes too.
    Router,
}

impl Role {
    pub const NAMES: [&'static str; 6] =
        ["read", "submit", "operator", "management", "node", "router"];

    /// Where the role stands in the chain read < submit < operator < management; a node
    /// token is in no chain.
    fn rank(self) -> Option<u8> {
        match self {
            Role::Read => Some(0),
            Role::Submit => Some(1),
            Role::Operator => Some(2),
            Role::Management => Some(3),
            Role::Node | Role::Router => None,
        }
    }

    /// Whether a token of this role may do what `needed` allows.
    pub fn allows(self, needed: Role) -> bool {
        match (self.rank(), needed.rank()) {
            (Some(have), Some(need)) => have >= need,
            // What a router token may do, every token of the chain may.
            (Some(_), None) => needed == Role::Router,
            _ => self == needed,
        }
    }

    pub fn parse(text: &str) -> Result<Role, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "read" => Ok(Role::Read),
            "submit" => Ok(Role::Submit),
            "operator" => Ok(Role::Operator),
            "management" => Ok(Role::Management),
            "node" => Ok(Role::Node),
            "router" => Ok(Role::Router),
            _ => Err(format!(
                "unknown role {text:?}; the roles are {}",
                Role::NAMES.join(", ")
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Submit => "submit",
            Role::Operator => "operator",
            Role::Management => "management",
            Role::Node => "node",
            Role::Router => "router",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The prefix of every token's text.
pub const TOKEN_PREFIX: &str = "cube.";
/// Hex digits in a token's ID.
pub const TOKEN_ID_LEN: usize = 16;
/// Hex digits in a token's secret.
pub const TOKEN_SECRET_LEN: usize = 64;
/// The longest life a token may be given (`--ttl`): a year. Longer, make it without one.
pub const MAX_TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The longest name a token may be given.
pub const MAX_TOKEN_NAME: usize = 128;

/// The waiting list's `Owner` of what a token submits (with `--acl`): the token's name, each
/// character `Owner` does not allow (it takes letters, digits, `.`, `_`, `-` and `@`) written
/// `-`, cut to `Owner`'s length.
pub fn owner_of_token(name: &str) -> String {
    name.trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@') {
                c
            } else {
                '-'
            }
        })
        .take(crate::task::MAX_OWNER_LEN)
        .collect()
}

/// Hex digits of the CA fingerprint a join token of a manager with TLS ends with.
pub const TOKEN_CA_FINGERPRINT_LEN: usize = 64;

fn is_hex(part: &str, len: usize) -> bool {
    part.len() == len && part.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// A token's text split in its ID and its secret, or `None` when it is not of Cube's shape:
/// `cube.<ID>.<SECRET>`, or a join token of a manager with TLS,
/// `cube.<ID>.<SECRET>.<CA SHA-256>`.
pub fn split_token(text: &str) -> Option<(&str, &str)> {
    let rest = text.trim().strip_prefix(TOKEN_PREFIX)?;
    let mut parts = rest.split('.');
    let (id, secret) = (parts.next()?, parts.next()?);
    if let Some(fingerprint) = parts.next()
        && !is_hex(fingerprint, TOKEN_CA_FINGERPRINT_LEN)
    {
        return None;
    }
    if parts.next().is_some() {
        return None;
    }
    (is_hex(id, TOKEN_ID_LEN) && is_hex(secret, TOKEN_SECRET_LEN)).then_some((id, secret))
}

/// The CA fingerprint a join token carries (`cube.<ID>.<SECRET>.<CA SHA-256>`), if any.
pub fn token_ca_fingerprint(text: &str) -> Option<&str> {
    split_token(text)?;
    let fingerprint = text.trim().rsplit('.').next()?;
    let parts = text.trim().split('.').count();
    (parts == 4).then_some(fingerprint)
}

/// A token as the manager stores it: never its secret, only the secret's SHA-256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Role")]
    pub role: Role,
    /// SHA-256 of the secret, in hex.
    #[serde(rename = "SecretHash")]
    pub secret_hash: String,
    #[serde(rename = "CreateTime")]
    pub create_time: DateTime<Utc>,
    /// After this the token is refused; `None`: it lasts until revoked.
    #[serde(
        rename = "ExpireTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub expire_time: Option<DateTime<Utc>>,
    /// A node token: the node it joined as (set at its first registration).
    #[serde(rename = "Node", default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The projects the token's role holds in (`*`: every one); none listed (a token made
    /// before projects): `default` only. A `management` token holds in every project.
    #[serde(rename = "Projects", default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
}

/// Whether a token of `role` listing `projects` reaches `project`.
pub fn reaches(role: Role, projects: &[String], project: &str) -> bool {
    matches!(role, Role::Management | Role::Router)
        || projects
            .iter()
            .any(|listed| listed == crate::project::ALL_PROJECTS || listed == project)
        || (projects.is_empty() && project == crate::project::DEFAULT_PROJECT)
}

impl TokenRecord {
    /// Whether the token may see and act on `project`'s records.
    pub fn reaches(&self, project: &str) -> bool {
        reaches(self.role, &self.projects, project)
    }

    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expire_time.is_some_and(|expiry| expiry <= now)
    }

    /// What `GET /acl/tokens` shows of it.
    pub fn view(&self) -> TokenView {
        TokenView {
            id: self.id.clone(),
            name: self.name.clone(),
            role: self.role,
            create_time: self.create_time,
            expire_time: self.expire_time,
            node: self.node.clone(),
            projects: self.projects.clone(),
        }
    }
}

/// A token as listed: everything but the hash of its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenView {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Role")]
    pub role: Role,
    #[serde(rename = "CreateTime")]
    pub create_time: DateTime<Utc>,
    #[serde(
        rename = "ExpireTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub expire_time: Option<DateTime<Utc>>,
    #[serde(rename = "Node", default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(rename = "Projects", default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
}

/// `POST /acl/tokens`: the token to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    #[serde(rename = "Role")]
    pub role: Role,
    /// A name to know it by in lists and the audit log [default: `<role>-<ID>`].
    #[serde(rename = "Name", default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How long it lasts (`"24h"`, `"90s"`); none: until revoked.
    #[serde(rename = "TTL", default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// The projects its role holds in (`["*"]`: every one) [default: `["default"]`].
    #[serde(rename = "Projects", default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
}

/// The answer to `POST /acl/tokens` and `POST /acl/bootstrap`: the token's text, shown once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCreated {
    #[serde(rename = "Token")]
    pub token: TokenView,
    /// `cube.<ID>.<SECRET>`: what `--token` and `CUBE_TOKEN` take. Not kept anywhere.
    #[serde(rename = "Secret")]
    pub secret: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_the_roles_below_them_allow() {
        assert!(Role::Management.allows(Role::Operator));
        assert!(Role::Submit.allows(Role::Read));
        assert!(!Role::Read.allows(Role::Submit));
        assert!(!Role::Management.allows(Role::Node));
        assert!(!Role::Node.allows(Role::Read));
        assert!(Role::Node.allows(Role::Node));
    }

    #[test]
    fn a_token_splits_only_when_it_has_cubes_shape() {
        let id = "0123456789abcdef";
        let secret = "ab".repeat(32);
        let text = format!("cube.{id}.{secret}");
        assert_eq!(split_token(&text), Some((id, secret.as_str())));
        assert_eq!(split_token("cube.xyz.abc"), None);
        assert_eq!(split_token(&format!("cube.{id}")), None);
        assert_eq!(split_token(""), None);
        let fingerprint = "cd".repeat(32);
        let joined = format!("cube.{id}.{secret}.{fingerprint}");
        assert_eq!(split_token(&joined), Some((id, secret.as_str())));
        assert_eq!(token_ca_fingerprint(&joined), Some(fingerprint.as_str()));
        assert_eq!(token_ca_fingerprint(&text), None);
        assert_eq!(split_token(&format!("{joined}.ab")), None);
        assert_eq!(split_token(&format!("cube.{id}.{secret}.xyz")), None);
    }

    #[test]
    fn a_tokens_name_becomes_an_owner_the_owner_rules_take() {
        assert_eq!(owner_of_token("ci"), "ci");
        assert_eq!(owner_of_token("alice@example.org"), "alice@example.org");
        assert_eq!(owner_of_token("night build"), "night-build");
        let long = owner_of_token(&"x".repeat(MAX_TOKEN_NAME));
        assert!(
            crate::task::owner_findings("Owner", &long).is_empty(),
            "{long}"
        );
        assert!(crate::task::owner_findings("Owner", &owner_of_token("é ü/")).is_empty());
    }
}
