//! A node leaving the cluster: its agent stopping cleanly (it says so
//! before it exits), or an operator removing one that went down and will
//! not come back (`ocmctl node remove`). Its pool is gone either way:
//! replicated allocations go on with their other copies, the others lose
//! the bytes they had there (shown `lost`), and the node is no longer
//! listed or placed on. It never touches another node.

use oncilla_model::node::NodeState;

use super::recovery::refresh_peers;
use super::{AgentLink, Master};
use crate::error::CoreError;

impl<L: AgentLink> Master<L> {
    /// Takes node `name` out of the cluster. `incarnation`: the agent
    /// itself leaving (it must be the start the master knows); `None`: an
    /// operator, who may remove only a node that is down. How many
    /// allocations lost bytes.
    ///
    /// # Errors
    /// [`CoreError::UnknownNode`]; [`CoreError::PermissionDenied`] for
    /// another start of the node; [`CoreError::NodeUp`] for an operator
    /// removing a node that is not down; a master still recovering.
    pub fn leave(&self, name: &str, incarnation: Option<u64>) -> Result<usize, CoreError> {
        self.check_serving()?;
        let mut st = self.lock();
        let Some(n) = st.nodes.get(name) else {
            let known = st.nodes.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(CoreError::UnknownNode {
                name: name.to_string(),
                known,
            });
        };
        match incarnation {
            Some(i) if i != n.incarnation => {
                return Err(CoreError::PermissionDenied(format!(
                    "node {name} is registered under another start of its agent"
                )))
            }
            None => {
                let (state, _) = n.seen.state(&self.liveness);
                if state != NodeState::Down {
                    return Err(CoreError::NodeUp(name.to_string(), state.name()));
                }
            }
            Some(_) => {}
        }
        let lost = Self::bytes_gone(&mut st, name);
        st.nodes.remove(name);
        refresh_peers(&mut st);
        tracing::warn!(
            node = %name,
            lost_allocations = lost,
            by = if incarnation.is_some() { "its agent" } else { "an operator" },
            "node left the cluster"
        );
        Ok(lost)
    }
}
