//! `oncilla.Session` and `oncilla.connect()`: a session with the local
//! agent (the environment liboncilla reads: `ONCILLA_SOCKET`, and a token
//! only for operators), and what it makes: allocations, attachments, and
//! copies between allocations. Every call that waits releases the GIL.

use std::path::PathBuf;

use liboncilla::{Oncilla, Options};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::allocation::{self, Allocation};
use crate::errors::to_py;
use crate::spec::{self, Placement};

/// A session with the local agent; allocations made through it end with
/// it (or with the process) unless persistent.
#[pyclass(module = "oncilla", name = "Session", frozen)]
pub struct Session {
    inner: Oncilla,
}

/// Connects to the local agent as liboncilla does: `ONCILLA_SOCKET` (or
/// `socket`), `ONCILLA_FABRIC`, `ONCILLA_STREAMS` and the other
/// `ONCILLA_*` settings.
#[pyfunction]
#[pyo3(signature = (socket=None))]
pub fn connect(py: Python<'_>, socket: Option<PathBuf>) -> PyResult<Session> {
    let inner = py
        .allow_threads(move || {
            let mut opts = Options::from_env()?;
            if let Some(s) = socket {
                opts.socket = s;
            }
            Oncilla::connect_with(opts)
        })
        .map_err(to_py)?;
    Ok(Session { inner })
}

#[pymethods]
impl Session {
    /// The name of this node.
    #[getter]
    fn node(&self) -> String {
        self.inner.node().to_string()
    }

    /// This session's id, as `ocmctl allocs` shows it.
    #[getter]
    fn session_id(&self) -> String {
        self.inner.session_id().to_string()
    }

    /// Ends the session now, as the process's exit would: the
    /// allocations it owns (not persistent ones) are freed, its
    /// attachments end, and later calls through it or its allocations
    /// fail. Closing again does nothing.
    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block closes the session.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Session(node={:?}, id={:?})",
            self.inner.node(),
            self.inner.session_id()
        )
    }

    /// Allocates `size` bytes of `kind` (a name as `ocmctl` prints it, or
    /// an `oncilla.Kind`; remote host memory by default), placed by `policy` or on `nodes` (with
    /// `weights`), striped in `stripe`-byte units, optionally `name`d
    /// (which makes it persistent), `persistent`, `shared` with other
    /// users, on GPU `gpu`, reached over `fabric`, kept in `replicas`
    /// copies on different nodes.
    #[pyo3(signature = (size, kind=None, *, policy=None, nodes=None, weights=None, stripe=None, name=None, persistent=false, shared=false, gpu=None, fabric=None, replicas=None))]
    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &self,
        py: Python<'_>,
        size: u64,
        kind: Option<Bound<'_, PyAny>>,
        policy: Option<Bound<'_, PyAny>>,
        nodes: Option<Vec<String>>,
        weights: Option<Vec<u32>>,
        stripe: Option<u64>,
        name: Option<String>,
        persistent: bool,
        shared: bool,
        gpu: Option<u32>,
        fabric: Option<String>,
        replicas: Option<u32>,
    ) -> PyResult<Allocation> {
        let spec = spec::alloc_spec(
            size,
            kind.as_ref(),
            Placement {
                policy,
                nodes,
                weights,
                stripe,
                name,
                persistent,
                shared,
                gpu,
                fabric,
                replicas,
            },
        )?;
        let session = self.inner.clone();
        let inner = py
            .allow_threads(move || session.alloc_with(&spec))
            .map_err(to_py)?;
        Ok(Allocation::new(self.inner.clone(), inner))
    }

    /// Makes `count` allocations of `size` bytes of `kind` together (one
    /// call to the master, all or none), placed and reached as `alloc`
    /// says; returns their handles in a list. Neither named nor
    /// persistent: those are made one at a time. `count` is 1 to 256.
    #[pyo3(signature = (size, count, kind=None, *, policy=None, nodes=None, weights=None, stripe=None, gpu=None, fabric=None, replicas=None))]
    #[allow(clippy::too_many_arguments)]
    fn alloc_many(
        &self,
        py: Python<'_>,
        size: u64,
        count: usize,
        kind: Option<Bound<'_, PyAny>>,
        policy: Option<Bound<'_, PyAny>>,
        nodes: Option<Vec<String>>,
        weights: Option<Vec<u32>>,
        stripe: Option<u64>,
        gpu: Option<u32>,
        fabric: Option<String>,
        replicas: Option<u32>,
    ) -> PyResult<Vec<Allocation>> {
        let spec = spec::alloc_spec(
            size,
            kind.as_ref(),
            Placement {
                policy,
                nodes,
                weights,
                stripe,
                name: None,
                persistent: false,
                shared: false,
                gpu,
                fabric,
                replicas,
            },
        )?;
        let session = self.inner.clone();
        let made = py
            .allow_threads(move || session.alloc_many(&spec, count))
            .map_err(to_py)?;
        Ok(made
            .into_iter()
            .map(|a| Allocation::new(self.inner.clone(), a))
            .collect())
    }

    /// Frees the allocations in `allocs` together (one call to the master,
    /// one per agent), all or none: when one may not be freed (views of
    /// it alive, mapped, another process attached), none is and every
    /// handle stays open. 1 to 256 of this session's handles, each once.
    fn free_many(&self, py: Python<'_>, allocs: Vec<Py<Allocation>>) -> PyResult<()> {
        let mut seen: Vec<*mut pyo3::ffi::PyObject> = allocs.iter().map(Py::as_ptr).collect();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(crate::errors::err(
                crate::errors::Class::InvalidArgument,
                "an allocation is given twice to free_many",
            ));
        }
        let objects: Vec<&Allocation> = allocs.iter().map(|a| a.get()).collect();
        let mut taken = Vec::with_capacity(objects.len());
        for a in &objects {
            match a.take() {
                Ok(inner) => taken.push(inner),
                Err(e) => {
                    // Nothing was freed: the handles taken go back.
                    for (a, inner) in objects.iter().zip(taken) {
                        a.restore(inner);
                    }
                    return Err(e);
                }
            }
        }
        let session = self.inner.clone();
        let (outcome, taken) = py.allow_threads(move || {
            let mut taken = taken;
            (session.free_many(&mut taken), taken)
        });
        match outcome {
            Ok(()) => {
                for a in &objects {
                    a.settle(Ok(()), None)?;
                }
                Ok(())
            }
            Err(e) => {
                for (a, inner) in objects.iter().zip(taken) {
                    a.restore(inner);
                }
                Err(to_py(e))
            }
        }
    }

    /// Attaches a persistent allocation by name (`str`) or id (`int`).
    fn attach(&self, py: Python<'_>, alloc: &Bound<'_, PyAny>) -> PyResult<Allocation> {
        let session = self.inner.clone();
        let inner = if let Ok(id) = alloc.extract::<u64>() {
            py.allow_threads(move || session.attach_id(id))
        } else if let Ok(name) = alloc.extract::<String>() {
            py.allow_threads(move || session.attach(&name))
        } else {
            return Err(PyTypeError::new_err(
                "attach takes an allocation's name (str) or id (int)",
            ));
        }
        .map_err(to_py)?;
        Ok(Allocation::new(self.inner.clone(), inner))
    }

    /// Copies `n` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset`, between any two kinds.
    fn copy(
        &self,
        py: Python<'_>,
        dst: &Allocation,
        dst_offset: u64,
        src: &Allocation,
        src_offset: u64,
        n: u64,
    ) -> PyResult<()> {
        allocation::copy_between(py, &self.inner, dst, dst_offset, src, src_offset, n)
    }
}
