//! A node leaving the cluster: its agent stopping cleanly (it says so
//! before it exits), or an operator removing one that went down and will
//! not come back (`ocmctl node remove`). Its pool is gone either way:
//! replicated allocations go on with their other copies, the others lose
//! the bytes they had there (shown `lost`), and the node is no longer
//! listed or placed on. It never touches another node.

use std::collections::BTreeSet;

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
    pub async fn leave(&self, name: &str, incarnation: Option<u64>) -> Result<usize, CoreError> {
        self.check_serving()?;
        let (lost, sessions) = self.take_out(name, incarnation)?;
        // Its processes went with it: what their sessions owned elsewhere
        // is freed, their attachments and charges end.
        for s in &sessions {
            self.end_session(s).await;
        }
        Ok(lost)
    }

    /// The table's side of [`Master::leave`]: the node out, its pool's
    /// bytes lost; the sessions it served, to end.
    fn take_out(
        &self,
        name: &str,
        incarnation: Option<u64>,
    ) -> Result<(usize, Vec<String>), CoreError> {
        let mut st = self.lock();
        let Some(n) = st.nodes.get(name) else {
            return Err(st.unknown_node(name));
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
        let attached = st.sessions.values().map(|s| &s.who);
        let sessions: BTreeSet<String> = st
            .owners()
            .chain(attached)
            .filter(|who| who.node == name)
            .map(|who| who.session_id.clone())
            .collect();
        st.nodes.remove(name);
        refresh_peers(&mut st);
        tracing::warn!(
            node = %name,
            lost_allocations = lost,
            by = if incarnation.is_some() { "its agent" } else { "an operator" },
            "node left the cluster"
        );
        Ok((lost, sessions.into_iter().collect()))
    }
}
