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
    hostname: String,
    boot_id: String,
    net_ns: u64,
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

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for s in [&self.hostname, &self.boot_id] {
            let b = s.as_bytes();
            let len = u16::try_from(b.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&b[..usize::from(len)]);
        }
        out.extend_from_slice(&self.net_ns.to_le_bytes());
        out
    }

    /// Decodes [`NodeId::encode`]; the rest of the bytes follow.
    pub(crate) fn decode(bytes: &[u8]) -> Option<(NodeId, &[u8])> {
        let mut rest = bytes;
        let mut take_str = || -> Option<String> {
            let len = usize::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?]));
            let s = rest.get(2..2usize.checked_add(len)?)?;
            let s = String::from_utf8(s.to_vec()).ok()?;
            rest = &rest[2 + len..];
            Some(s)
        };
        let hostname = take_str()?;
        let boot_id = take_str()?;
        let ns = rest.get(..8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(ns);
        Some((
            NodeId {
                hostname,
                boot_id,
                net_ns: u64::from_le_bytes(a),
            },
            &rest[8..],
        ))
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short: String = self.boot_id.chars().take(8).collect();
        write!(f, "{} (boot {short}, netns {})", self.hostname, self.net_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_round_trips_and_refuses_truncation() {
        let n = NodeId::from_parts("host-a", "1234-5678", 42);
        let mut enc = n.encode();
        enc.extend_from_slice(b"tail");
        let (back, rest) = NodeId::decode(&enc).unwrap_or((NodeId::from_parts("", "", 0), &[]));
        assert_eq!((back, rest), (n, &b"tail"[..]));
        for cut in 0..enc.len() - 4 {
            assert!(NodeId::decode(&enc[..cut]).is_none());
        }
    }
}
