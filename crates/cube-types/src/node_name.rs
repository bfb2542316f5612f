//! A node's name as tasks hold it: one shared string per node, not a copy in every task.
//!
//! A million tasks on ten thousand nodes name a hundred nodes each; as a `String` each task
//! held its own copy (a heap block of its own). A [`NodeName`] is an `Arc<str>`: cloning it
//! shares the text, and the manager's task cache hands every task of a node the same one.
//! On the wire it is a plain JSON string, as before.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A node's name, shared (see the module comment). Empty: not placed.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(Arc<str>);

impl NodeName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both hold the same shared text (not only equal text).
    pub fn shares(&self, other: &NodeName) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for NodeName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for NodeName {
    fn from(name: &str) -> NodeName {
        NodeName(Arc::from(name))
    }
}

impl From<String> for NodeName {
    fn from(name: String) -> NodeName {
        NodeName(Arc::from(name))
    }
}

impl From<&String> for NodeName {
    fn from(name: &String) -> NodeName {
        NodeName::from(name.as_str())
    }
}

impl From<NodeName> for String {
    fn from(name: NodeName) -> String {
        name.0.to_string()
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for NodeName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<NodeName> for str {
    fn eq(&self, other: &NodeName) -> bool {
        self == &*other.0
    }
}

impl PartialEq<NodeName> for &str {
    fn eq(&self, other: &NodeName) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<NodeName> for String {
    fn eq(&self, other: &NodeName) -> bool {
        **self == *other.0
    }
}

impl Serialize for NodeName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<NodeName, D::Error> {
        // Read as a `&str` where the input allows: no `String` made only to be copied.
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = NodeName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a node's name")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<NodeName, E> {
                Ok(NodeName::from(text))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_is_a_plain_json_string_and_compares_as_its_text() {
        let name = NodeName::from("w1");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"w1\"");
        let read: NodeName = serde_json::from_str("\"w1\"").unwrap();
        assert_eq!(read, name);
        let text = String::from("w1");
        assert_eq!(read, "w1");
        assert_eq!("w1", read);
        assert_eq!(read, text);
        assert_eq!(text, read);
        assert!(!read.shares(&name), "read anew: equal, not shared");
        assert!(name.clone().shares(&name), "a clone shares the text");
        assert!(NodeName::default().is_empty());
        assert_eq!(format!("{name} {name:?}"), "w1 \"w1\"");
    }
}
