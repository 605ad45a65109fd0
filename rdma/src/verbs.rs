//! The verbs layer (feature `verbs`): an opened RDMA port with its
//! protection domain, memory registrations, and RC queue pairs that post
//! RDMA READ / WRITE work requests and poll their completions.
//!
//! This is the only module that calls libibverbs. The `ibverbs` crate
//! lists devices and checks that user space can open them; its protection
//! domains, queue pairs and memory regions keep their raw handles private
//! and can neither register memory we own (the pool's slabs, caller
//! buffers) nor post RDMA READ/WRITE, so those objects are made here with
//! `ibverbs-sys`, the same bindings the crate uses, each wrapped so that
//! it is destroyed exactly once and never outlives what it was made from
//! (every object holds an `Arc` of its [`Device`]).
//!
//! It never decides what to copy (the client's planner does) and never
//! touches the network other than through the HCA.

use std::ffi::CStr;
use std::ptr;
use std::sync::Arc;

use ibverbs_sys as ffi;

use crate::discover::Port;
use crate::qp::{self, Endpoint, Path, State};
use crate::{Completion, RdmaError, Wr};

/// An opened port of an RDMA device and its protection domain.
pub struct Device {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    /// What sysfs said, with the active MTU filled in.
    pub port: Port,
    lid: u16,
    gid: [u8; 16],
    gid_index: Option<u32>,
    /// Whether the HCA registers memory on demand (ODP): such a
    /// registration follows the process's page tables instead of pinning
    /// the pages it found, so it stays right if the memory is remapped.
    pub odp: bool,
    /// The device's user-space verbs node in sysfs
    /// (`/sys/class/infiniband_verbs/uverbsN`): the kernel removes it the
    /// moment the device starts going away.
    verbs_node: std::path::PathBuf,
}

// SAFETY: libibverbs objects may be used from any thread; every verb that
// Oncilla calls on a context or PD is thread-safe per the rdma-core docs
// (ibv_reg_mr, ibv_create_cq/qp). Mutation of a QP is serialized by `&mut`.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The last OS error (errno), for a verb that returned NULL.
fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl Device {
    /// Opens `port` (from [`crate::discover::ports`]).
    ///
    /// # Errors
    /// User-space verbs cannot see or open the device (no provider library
    /// for it), or the port cannot be queried.
    pub fn open(port: &Port) -> Result<Arc<Device>, RdmaError> {
        let seen = ibverbs::devices().map_err(RdmaError::ListDevices)?;
        if !seen.iter().any(|d| {
            d.name()
                .is_some_and(|n| n.to_bytes() == port.device.as_bytes())
        }) {
            return Err(RdmaError::NoProvider {
                device: port.device.clone(),
            });
        }
        let port_num = u8::try_from(port.port).map_err(|_| RdmaError::PortNumber(port.port))?;
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(RdmaError::GetDeviceList(errno()));
        }
        let mut ctx = ptr::null_mut();
        let mut verbs_node = std::path::PathBuf::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: `list` holds `n` valid device pointers until freed.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is valid; the name is a NUL-terminated string
            // owned by the device.
            let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
            if name.to_bytes() == port.device.as_bytes() {
                // SAFETY: `dev` is valid while the list is alive; the
                // context stays valid after the list is freed.
                ctx = unsafe { ffi::ibv_open_device(dev) };
                // SAFETY: `dev` is valid; `dev_path` is a NUL-terminated
                // array inside it, copied out before the list is freed.
                let path = unsafe { CStr::from_ptr((*dev).dev_path.as_ptr()) };
                verbs_node = std::path::PathBuf::from(path.to_string_lossy().into_owned());
                break;
            }
        }
        // Read before the list is freed, which may set errno again.
        let open_error = errno();
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(RdmaError::OpenDevice {
                device: port.device.clone(),
                source: open_error,
            });
        }
        let close = |ctx| {
            // SAFETY: `ctx` was opened above and nothing else refers to it.
            unsafe { ffi::ibv_close_device(ctx) };
        };
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `ctx` is open; `attr` is a valid out-pointer of the
        // compat layout that ibv_query_port expects.
        let rc = unsafe {
            ffi::ibv_query_port(
                ctx,
                port_num,
                &mut attr as *mut ffi::ibv_port_attr as *mut _,
            )
        };
        if rc != 0 {
            close(ctx);
            return Err(RdmaError::QueryPort {
                port: port.label(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        let mut gid = [0u8; 16];
        if let Some(i) = port.gid_index() {
            let mut g = ffi::ibv_gid::default();
            // SAFETY: `ctx` is open; `g` is a valid out-pointer.
            let rc = unsafe { ffi::ibv_query_gid(ctx, port_num, i as i32, &mut g) };
            if rc != 0 {
                let source = errno();
                close(ctx);
                return Err(RdmaError::QueryGid {
                    port: port.label(),
                    index: i,
                    source,
                });
            }
            // SAFETY: `raw` is the 16-byte view of the GID union.
            gid = unsafe { g.raw };
        }
        // SAFETY: `ctx` is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            let source = errno();
            close(ctx);
            return Err(RdmaError::AllocPd(source));
        }
        let mut port = port.clone();
        port.active_mtu = qp::mtu_bytes(attr.active_mtu).unwrap_or(0);
        // Try an on-demand registration of one page: the HCA either takes
        // it or refuses (EINVAL / EOPNOTSUPP) without side effects.
        let mut probe = vec![0u8; 4096];
        let odp_access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_ON_DEMAND;
        // SAFETY: `probe` is mapped for the whole call and the registration
        // is released before it is dropped.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd,
                probe.as_mut_ptr().cast(),
                probe.len(),
                odp_access.0 as i32,
            )
        };
        let odp = !mr.is_null();
        if odp {
            // SAFETY: registered just above, released once.
            unsafe { ffi::ibv_dereg_mr(mr) };
        }
        Ok(Arc::new(Device {
            ctx,
            pd,
            lid: attr.lid,
            gid,
            gid_index: port.gid_index(),
            odp,
            verbs_node,
            port,
        }))
    }

    /// Whether the device is still there: false once the kernel has begun
    /// removing it (`rdma link delete`, a hot-unplugged or reset HCA).
    /// Some providers (rxe among them) cannot take a device away from a
    /// process: the removal then waits until every process has closed it,
    /// so whoever holds it must notice this and let go.
    pub fn present(&self) -> bool {
        std::fs::read_to_string(self.verbs_node.join("ibdev"))
            .is_ok_and(|name| name.trim() == self.port.device)
    }

    /// This port's half of an endpoint for a queue pair.
    pub fn endpoint(&self, qp_num: u32, psn: u32) -> Endpoint {
        Endpoint {
            qp_num,
            lid: self.lid,
            gid: self.gid,
            psn,
            mtu: self.port.active_mtu,
            roce: self.port.is_roce(),
        }
    }

    /// Registers `len` bytes at `addr` for local access and, when
    /// `remote`, for remote READ and WRITE.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be mapped memory that stays mapped until
    /// the returned [`Mr`] is dropped, and no request using it may be in
    /// flight when it is.
    ///
    /// # Errors
    /// The HCA refuses (memlock limit, too much pinned memory):
    /// [`RdmaError::RegisterMr`].
    pub unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        remote: bool,
    ) -> Result<Mr, RdmaError> {
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if self.odp && !remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_ON_DEMAND;
        }
        if remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: the caller guarantees the range is mapped for the life of
        // the registration; `pd` is alive while `self` is.
        let mr = unsafe { ffi::ibv_reg_mr(self.pd, addr.cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(RdmaError::RegisterMr {
                len,
                port: self.port.label(),
                source: errno(),
            });
        }
        Ok(Mr {
            mr,
            addr: addr as u64,
            len: len as u64,
            _dev: Arc::clone(self),
        })
    }
}

impl Device {
    /// Registers `len` bytes of GPU memory at device address `addr` for
    /// local access and remote READ and WRITE (GPUDirect RDMA): first as
    /// ordinary memory, which the kernel accepts when the nvidia-peermem
    /// module is loaded, then through `ibv_reg_dmabuf_mr` on the dma-buf
    /// `dmabuf` exports (exactly that range; asked for only when the first
    /// way fails). Says which way worked: `"nvidia-peermem"` or
    /// `"dma-buf"`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be device memory that stays allocated
    /// until the returned [`Mr`] is dropped, and no request using it may be
    /// in flight when it is.
    ///
    /// # Errors
    /// Both ways refused ([`RdmaError::RegisterDmabuf`]) or no dma-buf
    /// ([`RdmaError::NoDmabuf`]), each with its reason.
    pub unsafe fn register_device<E>(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        dmabuf: impl FnOnce() -> Result<std::os::fd::OwnedFd, E>,
    ) -> Result<(Mr, &'static str), RdmaError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use std::os::fd::AsRawFd;
        let access = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as i32;
        let made = |mr: *mut ffi::ibv_mr| Mr {
            mr,
            addr,
            len: len as u64,
            _dev: Arc::clone(self),
        };
        // SAFETY: the caller guarantees the device range stays allocated
        // for the life of the registration; without nvidia-peermem the
        // kernel finds no pages behind the address and refuses.
        let mr = unsafe { ffi::ibv_reg_mr(self.pd, addr as *mut std::ffi::c_void, len, access) };
        if !mr.is_null() {
            return Ok((made(mr), "nvidia-peermem"));
        }
        let peermem = errno();
        let fd = match dmabuf() {
            Ok(fd) => fd,
            Err(e) => {
                return Err(RdmaError::NoDmabuf {
                    peermem,
                    source: e.into(),
                })
            }
        };
        // SAFETY: `fd` exports exactly the device range (offset 0), which
        // the caller keeps allocated; the registration takes its own
        // reference to the dma-buf, so `fd` may close after this call.
        let mr = unsafe { ffi::ibv_reg_dmabuf_mr(self.pd, 0, len, addr, fd.as_raw_fd(), access) };
        if mr.is_null() {
            return Err(RdmaError::RegisterDmabuf {
                peermem,
                source: errno(),
            });
        }
        Ok((made(mr), "dma-buf"))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds an Arc of this device, so none is
        // left; the PD and context were made in `open` and are released
        // once, PD first.
        unsafe {
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

/// A memory registration.
pub struct Mr {
    mr: *mut ffi::ibv_mr,
    pub addr: u64,
    pub len: u64,
    _dev: Arc<Device>,
}

// SAFETY: an MR is an immutable handle after creation; its keys are read
// only, and deregistration happens once in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is valid until Drop.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is valid until Drop.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `Device::register`, deregistered once; the
        // caller of `register` promised no request is in flight.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A reliable-connected queue pair with its own completion queue.
pub struct Qp {
    qp: *mut ffi::ibv_qp,
    cq: *mut ffi::ibv_cq,
    state: State,
    psn: u32,
    /// Most work requests outstanding at once.
    pub depth: u32,
    dev: Arc<Device>,
    /// Scratch for `post`, kept so posting allocates nothing once warm;
    /// its pointers mean something only during one `post` call.
    sges: Vec<ffi::ibv_sge>,
    list: Vec<ffi::ibv_send_wr>,
}

// SAFETY: the QP and CQ are used by one owner at a time (`&mut` for posting
// and state changes); libibverbs allows that owner to be on any thread. The
// scratch vectors' raw pointers point into the vectors themselves and are
// rewritten on every `post`, so moving them across threads is harmless.
unsafe impl Send for Qp {}

impl Qp {
    /// A queue pair on `dev` in the INIT state, allowing remote READ and
    /// WRITE, with room for `depth` outstanding work requests.
    ///
    /// # Errors
    /// The HCA cannot make the CQ or QP, or refuses the INIT transition.
    pub fn new(dev: &Arc<Device>, depth: u32) -> Result<Qp, RdmaError> {
        let cqe = i32::try_from(depth).map_err(|_| RdmaError::QueueDepth(depth))?;
        // SAFETY: the context is open while `dev` lives; no channel, vector 0.
        let cq = unsafe { ffi::ibv_create_cq(dev.ctx, cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(RdmaError::CreateCq(errno()));
        }
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: ffi::ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: `pd` and `cq` are alive; `init` is a valid attribute block.
        let qp = unsafe { ffi::ibv_create_qp(dev.pd, &mut init) };
        if qp.is_null() {
            let e = RdmaError::CreateQp(errno());
            // SAFETY: made above, nothing uses it.
            unsafe { ffi::ibv_destroy_cq(cq) };
            return Err(e);
        }
        let mut me = Qp {
            qp,
            cq,
            state: State::Reset,
            psn: qp::random_psn(),
            depth,
            dev: Arc::clone(dev),
            sges: Vec::new(),
            list: Vec::new(),
        };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: u8::try_from(dev.port.port).unwrap_or(1),
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        me.modify(State::Init, &mut attr, mask)?;
        Ok(me)
    }

    /// This pair's endpoint, to send to the peer.
    pub fn endpoint(&self) -> Endpoint {
        // SAFETY: `qp` is valid until Drop.
        let num = unsafe { (*self.qp).qp_num };
        self.dev.endpoint(num, self.psn)
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Connects to the peer whose endpoint is `remote`: INIT -> RTR -> RTS.
    ///
    /// # Errors
    /// Endpoints that cannot pair ([`qp::path`]), or a refused transition.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<(), RdmaError> {
        let path: Path = qp::path(&self.endpoint(), self.dev.gid_index, remote)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: path.mtu,
            dest_qp_num: path.dest_qp_num,
            rq_psn: path.rq_psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.ah_attr.dlid = path.dlid;
        attr.ah_attr.port_num = u8::try_from(self.dev.port.port).unwrap_or(1);
        if let Some((gid, index)) = path.grh {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: gid };
            attr.ah_attr.grh.sgid_index = index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(State::Rtr, &mut attr, mask)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: path.sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(State::Rts, &mut attr, mask)
    }

    fn modify(
        &mut self,
        to: State,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Result<(), RdmaError> {
        let next = self.state.to(to)?;
        // SAFETY: `qp` is valid; `attr` is a valid attribute block for the
        // fields `mask` names.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(RdmaError::ModifyQp {
                to,
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        self.state = next;
        Ok(())
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The state the HCA reports for the pair now (`ibv_query_qp`), which
    /// can differ from [`Qp::state`]: the HCA moves a pair to ERROR by
    /// itself after a failed request. For diagnosing a stalled pair.
    ///
    /// # Errors
    /// The query failed (the device was removed, say).
    pub fn hw_state(&self) -> Result<&'static str, RdmaError> {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        // SAFETY: `qp` is valid until Drop; `attr` and `init` are attribute
        // blocks the call fills in, alive for the call.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.qp,
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(RdmaError::QueryQp(std::io::Error::from_raw_os_error(rc)));
        }
        use ffi::ibv_qp_state::*;
        Ok(match attr.qp_state {
            IBV_QPS_RESET => "RESET",
            IBV_QPS_INIT => "INIT",
            IBV_QPS_RTR => "RTR",
            IBV_QPS_RTS => "RTS",
            IBV_QPS_SQD => "SQD",
            IBV_QPS_SQE => "SQE",
            IBV_QPS_ERR => "ERROR",
            _ => "unknown",
        })
    }

    /// Stops the pair for good after a failure: to ERROR (every
    /// outstanding request is flushed) and then to RESET (the HCA drops
    /// what is left and stops processing). Call it before releasing memory
    /// that outstanding requests name: once it returns, the HCA touches
    /// none of it through this pair.
    ///
    /// # Errors
    /// The device refused the RESET transition (it was removed, say); the
    /// caller must then keep that memory registered and alive.
    pub fn stop(&mut self) -> Result<(), RdmaError> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        // Already in ERROR after an error completion: moving there again
        // is allowed and changes nothing; a refusal still leaves RESET to try.
        let _ = self.modify(State::Error, &mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE);
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RESET,
            ..Default::default()
        };
        self.modify(State::Reset, &mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Posts `wrs` as one linked list.
    ///
    /// # Safety
    /// Every local range must be registered under its `lkey` and stay
    /// valid (and, for a READ, not otherwise accessed) until a completion
    /// covering it is polled: its own, or a later signaled one on this
    /// pair.
    ///
    /// # Errors
    /// The send queue is full or a request is malformed.
    pub unsafe fn post(&mut self, wrs: &[Wr]) -> Result<(), RdmaError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let sges = &mut self.sges;
        sges.clear();
        sges.extend(wrs.iter().map(|w| ffi::ibv_sge {
            addr: w.local,
            length: w.len,
            lkey: w.lkey,
        }));
        // `sges` is complete and does not move while `list` points into it.
        let list = &mut self.list;
        list.clear();
        for (w, sge) in wrs.iter().zip(sges.iter_mut()) {
            let mut wr = ffi::ibv_send_wr {
                wr_id: w.wr_id,
                sg_list: sge,
                num_sge: 1,
                opcode: if w.read {
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_READ
                } else {
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                },
                send_flags: if w.signaled {
                    ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
                } else {
                    0
                },
                ..Default::default()
            };
            wr.wr.rdma.remote_addr = w.remote;
            wr.wr.rdma.rkey = w.rkey;
            list.push(wr);
        }
        // Link them; `list` no longer grows, so the pointers stay put.
        for i in 1..list.len() {
            let next: *mut ffi::ibv_send_wr = &mut list[i];
            list[i - 1].next = next;
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is valid and its context's ops table is filled by the
        // provider; `list` and `sges` outlive the call (the HCA copies the
        // descriptors before post_send returns); the caller vouches for the
        // memory the requests name.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            let Some(post_send) = (*ctx).ops.post_send else {
                return Err(RdmaError::NoProviderOp("post_send"));
            };
            post_send(self.qp, list.as_mut_ptr(), &mut bad)
        };
        if rc != 0 {
            return Err(RdmaError::PostSend(std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }

    /// Moves up to `out.len()` completions into `out`; never blocks.
    ///
    /// # Errors
    /// The CQ itself failed (overrun).
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize, RdmaError> {
        let mut wc = [ffi::ibv_wc::default(); 16];
        let want = out.len().min(wc.len());
        // SAFETY: `cq` is valid; `wc` has room for `want` entries.
        let n = unsafe {
            let ctx = (*self.cq).context;
            let Some(poll_cq) = (*ctx).ops.poll_cq else {
                return Err(RdmaError::NoProviderOp("poll_cq"));
            };
            poll_cq(self.cq, want as i32, wc.as_mut_ptr())
        };
        let n = usize::try_from(n).map_err(|_| RdmaError::PollCq)?;
        for (o, w) in out.iter_mut().zip(&wc[..n]) {
            let (status, vendor_err) = w.error().unwrap_or((0, 0));
            *o = Completion {
                wr_id: w.wr_id(),
                status,
                vendor_err,
            };
        }
        if out[..n].iter().any(|c| c.status != 0) {
            self.state = State::Error;
        }
        Ok(n)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: made in `new`, destroyed once, QP before its CQ.
        unsafe {
            ffi::ibv_destroy_qp(self.qp);
            ffi::ibv_destroy_cq(self.cq);
        }
    }
}
