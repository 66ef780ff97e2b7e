//! [`NodeId`]: which machine (and network namespace) a rank runs on, so that
//! file-descriptor passing between ranks on different nodes is refused with a
//! typed error instead of hanging on a socket that does not exist there.
//!
//! The identity is the host name, the kernel's boot id
//! (`/proc/sys/kernel/random/boot_id`: two containers on one host share it,
//! two hosts never do) and the network namespace (abstract Unix sockets are
//! per network namespace).

use std::fmt;
use std::os::unix::fs::MetadataExt;

/// The identity of the node (kernel instance and network namespace) this
/// process runs on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeId {
    pub(crate) hostname: String,
    pub(crate) boot_id: String,
    pub(crate) net_ns: u64,
}

impl NodeId {
    /// This process's node.
    ///
    /// # Errors
    /// When `/proc` cannot be read (not Linux, or `/proc` not mounted).
    pub fn current() -> std::io::Result<NodeId> {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_owned();
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
            .trim()
            .to_owned();
        let net_ns = std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino())
            .unwrap_or(0);
        Ok(NodeId {
            hostname,
            boot_id,
            net_ns,
        })
    }

    /// The host name.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// A node identity from its parts (for tests that simulate several nodes).
    pub fn from_parts(hostname: &str, boot_id: &str, net_ns: u64) -> NodeId {
        NodeId {
            hostname: hostname.to_owned(),
            boot_id: boot_id.to_owned(),
            net_ns,
        }
    }
}

impl fmt::Display for NodeId {
    /// `host (boot b, netns n)`: of a kernel's boot id (a UUID), its first
    /// 8 hex digits; of any other (a model fabric's node name), at most 64
    /// characters (it may come from a peer).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uuid = self.boot_id.len() == 36 && self.boot_id.as_bytes().get(8) == Some(&b'-');
        let short: String = self
            .boot_id
            .chars()
            .take(if uuid { 8 } else { 64 })
            .collect();
        write!(f, "{} (boot {short}, netns {})", self.hostname, self.net_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::NodeId;

    #[test]
    fn display_shows_a_uuid_boot_id_short_and_a_model_nodes_name_whole() {
        let k = NodeId::from_parts("h", "6c1f0d7e-8a4b-4f0e-9d2c-1b3a5e7f9c0d", 0);
        assert_eq!(k.to_string(), "h (boot 6c1f0d7e, netns 0)");
        let m = NodeId::from_parts("vm", "model-node-1", 0);
        assert_eq!(m.to_string(), "vm (boot model-node-1, netns 0)");
    }
}
