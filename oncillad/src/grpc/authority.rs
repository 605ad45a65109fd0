//! What a node may ask of the master, checked at the edge before the core
//! sees the request: a caller holding the cluster token (an operator, or
//! an agent started with the token) may ask anything; a caller holding one
//! node's credential acts only as that node and for that node's sessions
//! (whose ids start with the node's name), and never lists or looks up
//! allocations (their answers carry access keys). This module decides
//! nothing else and never calls the core.

use oncilla_model::alloc::{is_session_of, Owner};
use oncilla_model::cluster::{AllocateRequest, Heartbeat, Registration};
use oncilla_model::echo::echo;
use oncilla_net::credential::{principal, Principal};
use tonic::{Request, Status};

/// Who made a call: an operator (any node, any session) or one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Node(String),
}

impl Caller {
    /// The caller of `req`, as the interceptor admitted it.
    ///
    /// # Errors
    /// PERMISSION_DENIED for anyone else (the interceptor admits no one
    /// else; this holds if it ever does).
    pub fn of<T>(req: &Request<T>) -> Result<Self, Status> {
        match principal(req) {
            Some(Principal::Member) => Ok(Caller::Operator),
            Some(Principal::Node(n)) => Ok(Caller::Node(n.clone())),
            _ => Err(Status::permission_denied(
                "permission denied: the master takes the cluster token or a node credential",
            )),
        }
    }

    /// A node leaving the cluster: only as itself.
    pub fn leave(&self, node: &str) -> Result<(), Status> {
        self.as_node(node, "leave")
    }

    /// Refuses a node acting as `node`, unless it is that node.
    fn as_node(&self, node: &str, what: &str) -> Result<(), Status> {
        match self {
            Caller::Node(me) if me != node => Err(Status::permission_denied(format!(
                "permission denied: node {me}'s credential cannot {what} for node {}",
                echo(node)
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses a node acting for session `session_id`, unless the session
    /// is one of its own.
    fn for_session(&self, session_id: &str, what: &str) -> Result<(), Status> {
        match self {
            Caller::Node(me) if !is_session_of(session_id, me) => Err(Status::permission_denied(
                format!(
                    "permission denied: node {me}'s credential cannot {what} for session {} of another node",
                    echo(session_id)
                ),
            )),
            _ => Ok(()),
        }
    }

    fn for_owner(&self, who: &Owner, what: &str) -> Result<(), Status> {
        self.as_node(&who.node, what)?;
        self.for_session(&who.session_id, what)
    }

    /// A registration: as itself, holding only its own extents and
    /// sessions.
    pub fn register(&self, r: &Registration) -> Result<(), Status> {
        self.as_node(&r.node.name, "register")?;
        for a in &r.held {
            for e in &a.extents {
                self.as_node(&e.node, "report memory")?;
            }
        }
        for s in &r.sessions {
            self.for_owner(&s.who, "report a session")?;
        }
        Ok(())
    }

    pub fn heartbeat(&self, b: &Heartbeat) -> Result<(), Status> {
        self.as_node(&b.name, "send a heartbeat")?;
        for s in &b.ended_sessions {
            self.for_session(s, "end a session")?;
        }
        Ok(())
    }

    /// An allocation: from its own node, for one of its sessions (a node
    /// never allocates as an operator).
    pub fn allocate(&self, r: &AllocateRequest) -> Result<(), Status> {
        if let Caller::Node(me) = self {
            self.as_node(&r.origin_node, "allocate")?;
            let who = r.requester.as_ref().ok_or_else(|| {
                Status::permission_denied(format!(
                    "permission denied: node {me}'s credential allocates only for its sessions; operators allocate with the cluster token"
                ))
            })?;
            self.for_owner(who, "allocate")?;
        }
        Ok(())
    }

    /// A free, detach or attach on behalf of `who` (a node always names
    /// one of its sessions as `session_id`, and `who` is that session's
    /// process; only an operator frees by id alone, with no session).
    pub fn for_requester(
        &self,
        who: Option<&Owner>,
        session_id: &str,
        what: &str,
    ) -> Result<(), Status> {
        if let Caller::Node(me) = self {
            if session_id.is_empty() {
                return Err(Status::permission_denied(format!(
                    "permission denied: node {me}'s credential cannot {what} without a session; operators do that with the cluster token"
                )));
            }
            self.for_session(session_id, what)?;
            if let Some(who) = who {
                self.for_owner(who, what)?;
                if who.session_id != session_id {
                    return Err(Status::permission_denied(format!(
                        "permission denied: node {me}'s credential may {what} only for the session that asks"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Listing or looking up allocations (their access keys): operators
    /// only.
    pub fn operator(&self, what: &str) -> Result<(), Status> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Node(me) => Err(Status::permission_denied(format!(
                "permission denied: {what} needs the cluster token (an operator); node {me}'s credential does not reach it"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_belong_to_the_node_that_named_them() {
        let id = oncilla_model::alloc::session_id("node-1", Some(0), 0x00ff_00ff_00ff_00ff);
        assert_eq!(id, "node-1-u0-00ff00ff00ff00ff");
        assert!(is_session_of(&id, "node-1"));
        assert!(!is_session_of(&id, "node-10"));
        assert!(!is_session_of("node-10-u0-00ff00ff00ff00ff", "node-1"));
        assert!(!is_session_of("node-1-u0-00ff", "node-1"));
        assert!(!is_session_of("node-2-u0-00ff00ff00ff00ff", "node-1"));
        let n1 = Caller::Node("node-1".into());
        assert!(n1.for_session("node-1-u0-00ff00ff00ff00ff", "free").is_ok());
        let e = n1
            .for_session("node-2-u0-00ff00ff00ff00ff", "free")
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            n1.for_requester(None, "", "free").is_err(),
            "free by id alone"
        );
        let own = Owner {
            session_id: "node-1-u0-00ff00ff00ff00ff".into(),
            node: "node-1".into(),
            ..Owner::default()
        };
        assert!(
            n1.for_requester(Some(&own), "", "free").is_err(),
            "its own session as the requester, no session: as an operator"
        );
        assert!(
            n1.for_requester(Some(&own), "node-1-u0-0000000000000001", "free")
                .is_err(),
            "another of its sessions than the requester's"
        );
        assert!(n1
            .for_requester(Some(&own), &own.session_id, "free")
            .is_ok());
        assert!(n1.for_requester(None, &own.session_id, "detach").is_ok());
        assert!(Caller::Operator.for_requester(None, "", "free").is_ok());
        assert!(n1.operator("listing allocations").is_err());
        assert!(n1.as_node("node-2", "register").is_err());
        assert!(n1.as_node("node-1", "register").is_ok());
    }
}
