//! Batches: copies submitted together and run in the background, with no
//! order among them ([`crate::Oncilla::submit`]). Each copy owns its buffer and
//! keeps its allocation's descriptor, routes and mapping alive until the
//! batch ends. Copies into device memory of this process run here; the
//! rest go to the data path in one run. When that run fails as a lost node
//! or a move makes it fail, each copy is made again on its own through its
//! allocation's [`Failover`], as `copy_in` and `copy_out` would (every copy
//! of a batch may be repeated: a failed write was never acknowledged).

use std::sync::Arc;

use oncilla_cuda::DeviceMem;

use crate::allocation::Allocation;
use crate::client::Client;
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::fabric::shm::Mapping;
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Target, Transfer};
use crate::failover::{may_succeed_later, Failover, FAILOVER_WAIT};
use crate::route::Route;

/// Copies to run together in the background ([`crate::Oncilla::submit`]). Each
/// owns its buffer: a write's source, or the buffer a read fills; all come
/// back from [`Pending::wait`] in the order they were added.
#[derive(Default)]
pub struct Batch {
    ops: Vec<BatchOp>,
}

struct BatchOp {
    desc: Arc<Descriptor>,
    routes: Arc<[Route]>,
    local: Option<Arc<Mapping>>,
    device: Option<Arc<DeviceMem>>,
    failover: Arc<Failover>,
    offset: u64,
    write: bool,
    buf: Vec<u8>,
}

impl BatchOp {
    /// The copy as its allocation was opened.
    fn transfer(&mut self) -> Transfer<'_> {
        Transfer {
            target: Target {
                desc: &self.desc,
                routes: &self.routes,
                local: self.local.as_deref(),
            },
            offset: self.offset,
            buf: if self.write {
                IoBuf::Write(&self.buf)
            } else {
                IoBuf::Read(&mut self.buf)
            },
        }
    }

    /// The copy again, alone, through its allocation's failover.
    fn again(&mut self, data: &crate::fabric::DataPath) -> Result<()> {
        let target = Target {
            desc: &self.desc,
            routes: &self.routes,
            local: self.local.as_deref(),
        };
        let offset = self.offset;
        if self.write {
            self.failover
                .write(offset, &self.buf, FAILOVER_WAIT, |src| {
                    data.run([Transfer {
                        target,
                        offset,
                        buf: IoBuf::Write(src),
                    }])
                })
        } else {
            self.failover
                .read(offset, &mut self.buf, FAILOVER_WAIT, |dst| {
                    data.run([Transfer {
                        target,
                        offset,
                        buf: IoBuf::Read(dst),
                    }])
                })
        }
    }
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a write of `data` at `offset` of `alloc`.
    pub fn write(&mut self, alloc: &Allocation, offset: u64, data: Vec<u8>) -> &mut Self {
        self.push(alloc, offset, true, data)
    }

    /// Adds a read of `buf.len()` bytes at `offset` of `alloc` into `buf`.
    pub fn read(&mut self, alloc: &Allocation, offset: u64, buf: Vec<u8>) -> &mut Self {
        self.push(alloc, offset, false, buf)
    }

    fn push(&mut self, alloc: &Allocation, offset: u64, write: bool, buf: Vec<u8>) -> &mut Self {
        self.ops.push(BatchOp {
            desc: Arc::clone(&alloc.desc),
            routes: Arc::clone(&alloc.routes),
            local: alloc.local.clone(),
            device: alloc.device.clone(),
            failover: Arc::clone(&alloc.failover),
            offset,
            write,
            buf,
        });
        self
    }

    /// Copies added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Starts every copy of `batch` in the background on `client`'s runtime
/// ([`crate::Oncilla::submit`]).
pub(crate) fn submit(client: &Arc<Client>, batch: Batch) -> Pending {
    let data = Arc::clone(&client.data);
    let task = client.rt.spawn_blocking(move || {
        let mut ops = batch.ops;
        // Device memory of this process: copied here, the rest by the
        // data path, which reaches only cluster-held memory.
        let mut first_error = None;
        for op in ops.iter_mut() {
            let Some(mem) = &op.device else { continue };
            // DeviceMem checks bounds (its size is the allocation's).
            let moved = if op.write {
                mem.write(op.offset, &op.buf)
            } else {
                mem.read(op.offset, &mut op.buf)
            };
            if let Err(e) = moved {
                first_error.get_or_insert(e.into());
            }
        }
        let outcome = data.run(
            ops.iter_mut()
                .filter(|op| op.device.is_none())
                .map(BatchOp::transfer),
        );
        let outcome = match outcome {
            Err(e) if may_succeed_later(&e) => {
                tracing::debug!(error = %e, "a batch failed as a lost node or a move makes it fail; its copies go again one at a time");
                ops.iter_mut()
                    .filter(|op| op.device.is_none())
                    .try_for_each(|op| op.again(&data))
            }
            done => done,
        };
        let outcome = match first_error {
            Some(e) => Err(e),
            None => outcome,
        };
        let buffers = ops.into_iter().map(|op| op.buf).collect();
        (outcome, buffers)
    });
    Pending {
        client: Arc::clone(client),
        task,
    }
}

/// A submitted [`Batch`]. Dropping it does not cancel the copies; they run
/// to their end and their buffers are dropped.
pub struct Pending {
    /// Keeps the session (and its runtime) alive while the copies run.
    client: Arc<Client>,
    task: tokio::task::JoinHandle<(Result<()>, Vec<Vec<u8>>)>,
}

impl Pending {
    /// True once every copy has ended (then [`Pending::wait`] returns at once).
    pub fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for every copy; returns the buffers in the order they were
    /// added, reads filled.
    ///
    /// # Errors
    /// The first failure of any copy, as the blocking copies report them
    /// (the other copies still ran to their end).
    pub fn wait(self) -> Result<Vec<Vec<u8>>> {
        let client = Arc::clone(&self.client);
        client.rt.block_on(self)
    }
}

/// Async code awaits a batch instead of waiting for it: `ocm.submit(batch).await`.
impl std::future::Future for Pending {
    type Output = Result<Vec<Vec<u8>>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.task).poll(cx).map(|joined| {
            let (outcome, buffers) =
                joined.map_err(|e| Error::Internal(format!("batch task failed: {e}")))?;
            outcome.map(|()| buffers)
        })
    }
}
