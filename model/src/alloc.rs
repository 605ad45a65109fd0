//! Allocations as the master records them and the agents keep them: the
//! request (`AllocSpec`), the record (`Allocation` with its `Extent`s), who
//! owns or uses it (`Owner`) and how it is named (`AllocRef`).
//!
//! A value of these types is valid: the wire edge builds them through the
//! checks here (`AllocSpec::new`, `AllocRef::new`, `check_name`), never by
//! trusting a peer. This module holds no policy about placement or fabrics.

use crate::echo::echo;
use crate::{Fabric, Kind, Policy};

/// Largest single allocation accepted (1 PiB): anything above is a typo.
pub const MAX_ALLOCATION: u64 = 1 << 50;
/// Length of an allocation's access key.
pub const KEY_LEN: usize = 16;
/// Longest allocation name.
pub const MAX_NAME: usize = 128;
/// Longest program name a session may give: a file name's limit on Linux
/// (`NAME_MAX`), which is what clients send (their executable's name).
pub const MAX_PROGRAM: usize = 255;
/// Most nodes one request may name (a cluster of 1,024 agents, with room).
pub const MAX_SPEC_NODES: usize = 4096;
/// Longest node name a request may give.
pub const MAX_NODE_NAME: usize = 255;
/// Largest allocation id (2^53 - 1: exact wherever ids travel as JSON
/// numbers). A master counts ids up from where its start time puts them
/// (past every id an earlier master gave) and never reuses one; it refuses
/// to allocate past this rather than wrap.
pub const MAX_ID: u64 = (1 << 53) - 1;
/// Most extents one allocation may have (a 256 MiB allocation striped in
/// 4 KiB pieces). Every message that carries allocations is sized for it
/// (`oncilla_proto::client::MAX_MESSAGE`), and lists page by it.
pub const MAX_EXTENTS: usize = 1 << 16;
/// Most copies of an allocation's bytes (`Placement::replicas`).
pub const MAX_REPLICAS: u32 = 3;
/// Most allocations one batch makes (`alloc_many`), and most reservations
/// one call to an agent carries: small enough that a batch's work on an
/// agent (a registration with each RDMA port per allocation) fits one
/// call's deadline on a slow machine (256 took seconds under Soft-RoCE in
/// an emulated guest; 1,024 passed the 15 s deadline there).
pub const MAX_BATCH: u32 = 256;

/// A request the model refuses, said so a person can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("size {0} is above the limit of {MAX_ALLOCATION} bytes")]
    TooLarge(u64),
    /// The name as [`echo`] quotes it.
    #[error(
        "bad name {0}: start with a letter; use letters, digits, '.', '_', '-'; at most 128 bytes"
    )]
    Name(String),
    /// The name as [`echo`] quotes it, and its length.
    #[error("name {0} is too long: {1} bytes, at most {MAX_NAME}")]
    NameTooLong(String, usize),
    #[error("name an allocation by id or name")]
    NoRef,
    #[error("allocation id {0} is above the limit of {MAX_ID}")]
    Id(u64),
    #[error("{0} extents; an allocation has at most {MAX_EXTENTS} (use a larger stripe)")]
    Extents(usize),
    #[error("{0} extents in one batch; a batch's allocations have at most {MAX_EXTENTS} together (ask for fewer at once, or a larger stripe)")]
    BatchExtents(usize),
    #[error("a batch makes 1 to {MAX_BATCH} allocations, not {0}")]
    BatchCount(u64),
    #[error("a batch makes a session's own allocations: named and persistent ones are made one at a time")]
    BatchPersistent,
    #[error("a batch frees 1 to {MAX_BATCH} allocations, not {0}")]
    FreeCount(u64),
    #[error("allocation {0} is named twice in one batch to free")]
    FreeTwice(u64),
    #[error("memory kind not given (local or remote host, local or remote GPU)")]
    NoKind,
    #[error("local GPU memory lives in the asking process and ends with it: it cannot be named or persistent, and only a session can ask for it (use remote-gpu)")]
    LocalGpu,
    #[error("an access key is {KEY_LEN} bytes, not {0}")]
    KeyLength(usize),
    /// The program name as [`echo`] quotes it, and its length.
    #[error("program name {0} is not a file name: {1} bytes (at most {MAX_PROGRAM}), no control characters")]
    Program(String, usize),
    #[error("{0} nodes named; a request names at most {MAX_SPEC_NODES}")]
    TooManyNodes(usize),
    /// The node name as [`echo`] quotes it, and its length.
    #[error("node name {0} is too long: {1} bytes, at most {MAX_NODE_NAME}")]
    NodeNameTooLong(String, usize),
    #[error("extents' copy numbers disagree with their list: the primary's are 0, the replicas' 1 and up")]
    Copies,
    #[error("{0} replicas; an allocation has 1 to {MAX_REPLICAS} copies")]
    Replicas(u32),
    #[error("replicas are for remote host memory: {0:?} memory cannot be replicated")]
    ReplicasKind(Kind),
    #[error("a replicated allocation is reached over TCP (every write goes through its primary, which copies it to the replicas); it cannot use {0}")]
    ReplicasFabric(Fabric),
    #[error(
        "byte ranges must each hold a byte, end before 2^64, and come in order without overlapping"
    )]
    Ranges,
    /// The zone label as [`echo`] quotes it.
    #[error("zone {0} is not a label: a letter or digit first, then letters, digits, '.', '_' and '-', at most {max} bytes", max = crate::node::MAX_ZONE)]
    Zone(String),
}

/// Checks the program name a session gives (shown to operators and kept
/// with every allocation the session owns, so it is bounded and holds no
/// control characters that could forge a log line).
///
/// # Errors
/// [`Invalid::Program`] (quoting a bounded prefix).
pub fn check_program(program: &str) -> Result<(), Invalid> {
    if program.len() > MAX_PROGRAM || program.chars().any(char::is_control) {
        return Err(Invalid::Program(echo(program), program.len()));
    }
    Ok(())
}

/// A program name as [`check_program`] accepts it, made from any string
/// (what a client sends for its executable's name): control characters
/// become `?`, and it is cut at a character boundary to [`MAX_PROGRAM`].
pub fn program_name(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_PROGRAM));
    for c in raw.chars().map(|c| if c.is_control() { '?' } else { c }) {
        if out.len() + c.len_utf8() > MAX_PROGRAM {
            break;
        }
        out.push(c);
    }
    out
}

/// Checks the length of a node's name as a request names it: at most
/// [`MAX_NODE_NAME`] bytes.
///
/// # Errors
/// [`Invalid::NodeNameTooLong`] (quoting a bounded prefix).
pub fn check_node_name(node: &str) -> Result<(), Invalid> {
    if node.len() > MAX_NODE_NAME {
        return Err(Invalid::NodeNameTooLong(echo(node), node.len()));
    }
    Ok(())
}

/// Checks an allocation name: it starts with a letter and holds letters,
/// digits, '.', '_' and '-' (never only digits, so a name is never
/// mistaken for an id), at most [`MAX_NAME`] bytes.
///
/// # Errors
/// [`Invalid::NameTooLong`], [`Invalid::Name`] (quoting a bounded prefix).
pub fn check_name(name: &str) -> Result<(), Invalid> {
    if name.len() > MAX_NAME {
        return Err(Invalid::NameTooLong(echo(name), name.len()));
    }
    let ok = name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Invalid::Name(echo(name)))
    }
}

/// A node named in a transparent request, with its relative share.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeShare {
    pub node: String,
    /// Relative weight; 0 counts as 1.
    pub weight: u32,
}

/// Where an allocation may go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    pub policy: Policy,
    /// Exactly these nodes, split by weight (overrides the policy).
    pub nodes: Vec<NodeShare>,
    /// Round-robin unit in bytes; 0 gives each node one contiguous range.
    pub stripe: u64,
    /// GPU kinds: the device index on the node.
    pub gpu: Option<u32>,
    /// Copies of every byte, each on another node (0 counts as 1; at most
    /// [`MAX_REPLICAS`]).
    pub replicas: u32,
}

impl Placement {
    /// How many copies of every byte it asks for (at least 1).
    pub fn copies(&self) -> u32 {
        self.replicas.max(1)
    }
}

/// What an application or operator asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocSpec {
    pub size: u64,
    pub kind: Kind,
    pub placement: Placement,
    /// Empty: unnamed. A name makes the allocation persistent.
    pub name: String,
    pub persistent: bool,
    /// The fabric the creator prefers.
    pub fabric: Fabric,
    /// A persistent allocation any user may attach (otherwise only its
    /// creator's user and operators).
    pub shared: bool,
}

impl AllocSpec {
    /// Whether what it makes outlives the session that asks (persistent,
    /// or named: a name makes it persistent). Its maker is attached to it.
    pub fn outlives_session(&self) -> bool {
        self.persistent || !self.name.is_empty()
    }

    /// A checked request.
    ///
    /// # Errors
    /// [`Invalid::TooLarge`], [`Invalid::Name`].
    pub fn new(
        size: u64,
        kind: Kind,
        placement: Placement,
        name: String,
        persistent: bool,
        fabric: Fabric,
    ) -> Result<Self, Invalid> {
        if size > MAX_ALLOCATION {
            return Err(Invalid::TooLarge(size));
        }
        if !name.is_empty() {
            check_name(&name)?;
        }
        if placement.nodes.len() > MAX_SPEC_NODES {
            return Err(Invalid::TooManyNodes(placement.nodes.len()));
        }
        for n in &placement.nodes {
            check_node_name(&n.node)?;
        }
        if placement.replicas > MAX_REPLICAS {
            return Err(Invalid::Replicas(placement.replicas));
        }
        if placement.copies() > 1 {
            if kind != Kind::RemoteHost {
                return Err(Invalid::ReplicasKind(kind));
            }
            if !matches!(fabric, Fabric::Auto | Fabric::Tcp) {
                return Err(Invalid::ReplicasFabric(fabric));
            }
        }
        Ok(Self {
            size,
            kind,
            placement,
            name,
            persistent,
            fabric,
            shared: false,
        })
    }

    /// Lets any user attach it (a persistent allocation; see
    /// [`AllocSpec::shared`]).
    #[must_use]
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }
}

/// An allocation named by id or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocRef {
    Id(u64),
    Name(String),
}

impl AllocRef {
    /// The id when it is not 0, else the name.
    ///
    /// # Errors
    /// [`Invalid::NoRef`] when both are empty, [`Invalid::Id`] above
    /// [`MAX_ID`], [`Invalid::Name`] / [`Invalid::NameTooLong`] for a name
    /// no allocation can have.
    pub fn new(id: u64, name: String) -> Result<Self, Invalid> {
        match (id, name.is_empty()) {
            (id, _) if id > MAX_ID => Err(Invalid::Id(id)),
            (0, true) => Err(Invalid::NoRef),
            (0, false) => {
                // No allocation can have a name the naming rule refuses:
                // looking one up is a mistake, said as such (and bounded).
                check_name(&name)?;
                Ok(Self::Name(name))
            }
            (id, _) => Ok(Self::Id(id)),
        }
    }
}

impl std::fmt::Display for AllocRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocRef::Id(id) => write!(f, "{id}"),
            AllocRef::Name(n) => f.write_str(n),
        }
    }
}

/// A process that owns or uses allocations, through its node's agent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    pub session_id: String,
    pub node: String,
    pub pid: u32,
    pub program: String,
    /// The start of the agent that opened the session.
    pub agent_incarnation: u64,
    /// The session's number within that start.
    pub session_seq: u64,
    /// The process's user, as its agent's Unix socket saw it.
    pub uid: Option<u32>,
}

/// The id of a session that node `node` opens for a process of user
/// `uid`, `nonce` its random part: `<node>-u<uid>-<16 hex digits>` (`u`
/// alone where the kernel named no user), so the id says which node and
/// which user it belongs to. A session's credential is a MAC of its id,
/// so every agent that checks the credential can trust both.
pub fn session_id(node: &str, uid: Option<u32>, nonce: u64) -> String {
    match uid {
        Some(uid) => format!("{node}-u{uid}-{nonce:016x}"),
        None => format!("{node}-u-{nonce:016x}"),
    }
}

/// The user and nonce parts of a session id (`u<uid>` or `u`, and 16 hex
/// digits): `Some(uid)` when well-formed.
fn session_tail(tail: &str) -> Option<Option<u32>> {
    let (user, nonce) = tail.split_once('-')?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match user.strip_prefix('u')? {
        "" => Some(None),
        digits if digits.bytes().all(|b| b.is_ascii_digit()) => digits.parse().ok().map(Some),
        _ => None,
    }
}

/// Whether `session_id` is one [`session_id`] made for `node`.
pub fn is_session_of(session_id: &str, node: &str) -> bool {
    session_id
        .strip_prefix(node)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(session_tail)
        .is_some()
}

/// Whether a process on `node` may map the allocation's memory on that node
/// (`owner_session`: the owning session, `None` for a persistent one): a
/// persistent allocation may be attached by any process, a session's only
/// by that session, so only memory on the session's own node is ever
/// mapped. Agents give memory nobody may map no memory file of its own
/// (it costs no descriptor), and clients copy it instead of mapping it.
///
/// A replicated allocation (`copies` above 1) is never mapped: a store
/// through a mapping would bypass the primary, which copies every write
/// to the replicas.
pub fn mappable_on(owner_session: Option<&str>, node: &str, copies: u32) -> bool {
    copies <= 1 && owner_session.is_none_or(|s| is_session_of(s, node))
}

/// The user a [`session_id`] was made for (`None`: not said, or not a
/// session id). Node names may hold '-', so the user is read from the end.
pub fn session_user(session_id: &str) -> Option<u32> {
    let mut parts = session_id.rsplitn(3, '-');
    let nonce = parts.next()?;
    let user = parts.next()?;
    parts.next()?;
    session_tail(&format!("{user}-{nonce}")).flatten()
}

impl std::fmt::Display for Owner {
    /// "pid 12 (prog@node-1)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({}@{})", self.pid, self.program, self.node)
    }
}

/// A registration of an extent with one RDMA port of its agent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaRegion {
    pub device: String,
    pub port: u32,
    pub addr: u64,
    pub rkey: u32,
    /// The agent start that registered it.
    pub incarnation: u64,
}

/// A contiguous piece of an allocation held by one agent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extent {
    pub node: String,
    pub alloc_offset: u64,
    pub len: u64,
    pub pool_offset: u64,
    pub data_addr: String,
    /// What the creator uses to reach it.
    pub fabric: Fabric,
    pub agent_addr: String,
    /// Device memory: the GPU index on the node.
    pub gpu: Option<u32>,
    pub rdma: Vec<RdmaRegion>,
    /// Which copy of the bytes it holds: 0 the primary (every write goes
    /// to it), 1 and up the replicas it copies each write to.
    pub copy: u32,
    /// A new copy's extent that its agent has not yet heard is whole: it
    /// was reserved to be filled from a live copy (re-created or moved),
    /// and the master that listed it has not confirmed it. Only agents'
    /// reports set it; a new master never takes such an extent as a copy
    /// (its fill may have been cut short with the master that ran it).
    pub filling: bool,
}

/// Whether every byte of an allocation is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Health {
    #[default]
    Healthy,
    /// Some extents are on a node that is down; they come back with it.
    Degraded,
    /// Some extents were on a node that restarted: those bytes are gone.
    Lost,
}

/// An allocation as the master records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub id: u64,
    pub size: u64,
    pub kind: Kind,
    /// The primary copy, in allocation order: every write goes here.
    pub extents: Vec<Extent>,
    /// The other copies' extents (`copy` 1 and up), each copy tiling the
    /// allocation as the primary does (possibly in other pieces), in
    /// (copy, allocation) order; empty for one copy.
    pub replicas: Vec<Extent>,
    /// [`KEY_LEN`] bytes, or empty in the records agents keep.
    pub access_key: Vec<u8>,
    /// The owning session; `None` for a persistent allocation.
    pub owner: Option<Owner>,
    pub created_unix_ms: u64,
    /// Empty: unnamed.
    pub name: String,
    /// Processes attached (derived by the master when shown).
    pub attached: Vec<Owner>,
    pub placement: Placement,
    pub origin_node: String,
    /// Derived by the master when shown.
    pub health: Health,
    pub health_notes: Vec<String>,
    /// The user of the process that made it; `None` when an operator did.
    pub user: Option<u32>,
    /// Any user may attach it.
    pub shared: bool,
    /// Derived by the master when shown: it is moving off a drained node
    /// (that node's copy is reached over TCP only until it has moved).
    pub moving: bool,
}

impl Allocation {
    /// A fresh record with no extents, key, attachments or health notes.
    pub fn new(id: u64, size: u64, kind: Kind) -> Self {
        Self {
            id,
            size,
            kind,
            extents: Vec::new(),
            replicas: Vec::new(),
            access_key: Vec::new(),
            owner: None,
            created_unix_ms: 0,
            name: String::new(),
            attached: Vec::new(),
            placement: Placement::default(),
            origin_node: String::new(),
            health: Health::Healthy,
            health_notes: Vec::new(),
            user: None,
            shared: false,
            moving: false,
        }
    }

    /// Every extent of every copy: the primary's, then the replicas'.
    pub fn all_extents(&self) -> impl Iterator<Item = &Extent> {
        self.extents.iter().chain(&self.replicas)
    }

    /// Whether `node` holds any copy of any of its bytes.
    pub fn held_on(&self, node: &str) -> bool {
        self.all_extents().any(|e| e.node == node)
    }

    /// Adds extents of every copy a node reported (`other`'s), each list
    /// kept in its order.
    pub fn merge_extents(&mut self, other: &Allocation) {
        self.extents.extend(other.extents.iter().cloned());
        self.extents.sort_by_key(|e| e.alloc_offset);
        self.replicas.extend(other.replicas.iter().cloned());
        self.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
    }

    /// The replicas' copy numbers, in order.
    pub fn replica_copies(&self) -> Vec<u32> {
        let mut copies: Vec<u32> = self.replicas.iter().map(|e| e.copy).collect();
        copies.dedup();
        copies
    }

    /// The extents of copy `copy` (0: the primary), in allocation order.
    pub fn copy_extents(&self, copy: u32) -> impl Iterator<Item = &Extent> {
        let (primary, replicas) = if copy == 0 {
            (&self.extents[..], &[][..])
        } else {
            (&[][..], &self.replicas[..])
        };
        primary
            .iter()
            .chain(replicas.iter().filter(move |e| e.copy == copy))
    }

    /// The first byte range no extent of copy `copy` covers, if any.
    pub fn first_gap(&self, copy: u32) -> Option<(u64, u64)> {
        let mut at = 0;
        for e in self.copy_extents(copy) {
            if e.alloc_offset > at {
                return Some((at, e.alloc_offset));
            }
            at = at.max(e.alloc_offset + e.len);
        }
        (at < self.size).then_some((at, self.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_refs_are_checked() {
        assert!(check_name("table.v2_a-b").is_ok());
        assert!(check_name("9lives").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(129)).is_err());
        assert_eq!(AllocRef::new(3, "x".into()), Ok(AllocRef::Id(3)));
        assert_eq!(AllocRef::new(0, String::new()), Err(Invalid::NoRef));
        assert_eq!(AllocRef::new(0, "t".into()), Ok(AllocRef::Name("t".into())));
        assert_eq!(
            AllocRef::new(MAX_ID, String::new()),
            Ok(AllocRef::Id(MAX_ID))
        );
        assert_eq!(
            AllocRef::new(u64::MAX, String::new()),
            Err(Invalid::Id(u64::MAX))
        );
    }

    #[test]
    fn sizes_are_bounded() {
        let spec = |size| {
            AllocSpec::new(
                size,
                Kind::RemoteHost,
                Placement::default(),
                String::new(),
                false,
                Fabric::Auto,
            )
        };
        assert!(spec(MAX_ALLOCATION).is_ok());
        assert_eq!(
            spec(MAX_ALLOCATION + 1),
            Err(Invalid::TooLarge(MAX_ALLOCATION + 1))
        );
    }

    #[test]
    fn gaps_are_found() {
        let mut a = Allocation::new(1, 30, Kind::RemoteHost);
        let ext = |alloc_offset, len| Extent {
            alloc_offset,
            len,
            ..Extent::default()
        };
        a.extents = vec![ext(0, 10), ext(20, 10)];
        assert_eq!(a.first_gap(0), Some((10, 20)));
        a.extents.insert(1, ext(10, 10));
        assert_eq!(a.first_gap(0), None);
        a.size = 40;
        assert_eq!(a.first_gap(0), Some((30, 40)));
    }

    #[test]
    fn program_names_are_file_names() {
        assert!(check_program("scan").is_ok());
        assert!(check_program(&"p".repeat(MAX_PROGRAM)).is_ok());
        let long = "p".repeat(25 << 20);
        let e = check_program(&long).unwrap_err().to_string();
        assert!(e.contains("26214400 bytes") && e.len() < 300, "{e}");
        assert!(check_program("evil\nsession opened").is_err());
        // What clients send is always accepted.
        for raw in [long.as_str(), "a\u{7}b", &"é".repeat(200)] {
            let p = program_name(raw);
            assert!(check_program(&p).is_ok(), "{p:?}");
        }
        assert_eq!(program_name("a\tb"), "a?b");
        assert_eq!(
            program_name(&"é".repeat(200)).len(),
            254,
            "cut at a character"
        );
    }

    #[test]
    fn requests_name_a_bounded_number_of_bounded_nodes() {
        let place = |n: usize, len: usize| Placement {
            nodes: (0..n)
                .map(|i| NodeShare {
                    node: format!("{i:0len$}"),
                    weight: 1,
                })
                .collect(),
            ..Placement::default()
        };
        let spec = |p| {
            AllocSpec::new(
                4096,
                Kind::RemoteHost,
                p,
                String::new(),
                false,
                Fabric::Auto,
            )
        };
        assert!(spec(place(MAX_SPEC_NODES, 8)).is_ok());
        assert_eq!(
            spec(place(MAX_SPEC_NODES + 1, 8)),
            Err(Invalid::TooManyNodes(MAX_SPEC_NODES + 1))
        );
        assert!(matches!(
            spec(place(1, MAX_NODE_NAME + 1)),
            Err(Invalid::NodeNameTooLong(_, 256))
        ));
    }

    #[test]
    fn session_ids_name_their_node_and_user() {
        let id = session_id("rack-u5", Some(1000), 0x00ff_00ff_00ff_00ff);
        assert_eq!(id, "rack-u5-u1000-00ff00ff00ff00ff");
        assert!(is_session_of(&id, "rack-u5"));
        assert!(!is_session_of(&id, "rack"));
        assert_eq!(session_user(&id), Some(1000));
        let nobody = session_id("n1", None, 7);
        assert!(is_session_of(&nobody, "n1"));
        assert_eq!(session_user(&nobody), None);
        for bad in [
            "n1-u12-00ff",
            "n1-12-00ff00ff00ff00ff",
            "n1-ux-00ff00ff00ff00ff",
            "u1-00ff00ff00ff00ff",
            "",
        ] {
            assert!(!is_session_of(bad, "n1"), "{bad}");
            assert_eq!(session_user(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_persistent_memory_and_a_sessions_own_node_are_mappable() {
        let id = session_id("n1", Some(1000), 7);
        assert!(mappable_on(Some(&id), "n1", 1));
        assert!(!mappable_on(Some(&id), "n2", 1));
        assert!(!mappable_on(Some(&id), "n", 1));
        assert!(mappable_on(None, "n2", 1));
        // A replicated allocation is never mapped: writes go through its
        // primary.
        assert!(!mappable_on(None, "n2", 2));
        assert!(!mappable_on(Some(&id), "n1", 3));
    }

    #[test]
    fn replicas_are_bounded_and_for_remote_host_memory_over_tcp() {
        let spec = |kind, replicas, fabric| {
            let placement = Placement {
                replicas,
                ..Placement::default()
            };
            AllocSpec::new(1 << 20, kind, placement, String::new(), false, fabric)
        };
        assert!(spec(Kind::RemoteHost, 0, Fabric::Auto).is_ok());
        assert!(spec(Kind::RemoteHost, 3, Fabric::Tcp).is_ok());
        assert_eq!(
            spec(Kind::RemoteHost, 4, Fabric::Tcp),
            Err(Invalid::Replicas(4))
        );
        assert_eq!(
            spec(Kind::RemoteGpu, 2, Fabric::Auto),
            Err(Invalid::ReplicasKind(Kind::RemoteGpu))
        );
        assert_eq!(
            spec(Kind::LocalHost, 2, Fabric::Auto),
            Err(Invalid::ReplicasKind(Kind::LocalHost))
        );
        assert_eq!(
            spec(Kind::RemoteHost, 2, Fabric::Verbs),
            Err(Invalid::ReplicasFabric(Fabric::Verbs))
        );
    }
}
