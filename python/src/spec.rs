//! `Session.alloc`'s keyword arguments into a `liboncilla::AllocSpec`,
//! checked here once with Python errors that name the argument. Kinds and
//! policies are taken by the names `ocmctl` uses or as members of
//! `oncilla.Kind` / `oncilla.Policy` (whose values are those names).

use liboncilla::{AllocSpec, Fabric, Kind, Policy};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A name given as a string or as an enum member whose `.value` is one.
pub fn name_of(arg: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s);
    }
    v.getattr("value")
        .and_then(|x| x.extract::<String>())
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{arg} must be a str or an oncilla enum member, not {}",
                v.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })
}

/// A kind by name or member.
fn kind_of(v: &Bound<'_, PyAny>) -> PyResult<Kind> {
    name_of("kind", v)?
        .parse()
        .map_err(|e: oncilla_model::UnknownName| PyValueError::new_err(e.to_string()))
}

/// Everything `alloc` takes besides size and kind.
pub struct Placement<'py> {
    pub policy: Option<Bound<'py, PyAny>>,
    pub nodes: Option<Vec<String>>,
    pub weights: Option<Vec<u32>>,
    pub stripe: Option<u64>,
    pub name: Option<String>,
    pub persistent: bool,
    pub shared: bool,
    pub gpu: Option<u32>,
    pub fabric: Option<String>,
    pub replicas: Option<u32>,
}

/// The spec `alloc` asks for.
///
/// # Errors
/// `ValueError` for an unknown policy or fabric, weights that do not
/// match the nodes, or a zero weight.
pub fn alloc_spec(
    size: u64,
    kind: Option<&Bound<'_, PyAny>>,
    p: Placement<'_>,
) -> PyResult<AllocSpec> {
    // Remote host memory unless asked otherwise.
    let kind = kind.map_or(Ok(Kind::RemoteHost), kind_of)?;
    let mut spec = AllocSpec::new(size, kind);
    if let Some(policy) = &p.policy {
        let policy: Policy = name_of("policy", policy)?
            .parse()
            .map_err(|e: oncilla_model::UnknownName| PyValueError::new_err(e.to_string()))?;
        spec = spec.policy(policy);
    }
    match (p.nodes, p.weights) {
        (None, Some(_)) => {
            return Err(PyValueError::new_err(
                "weights need nodes: give one per node",
            ));
        }
        (Some(nodes), None) => spec = spec.on_nodes(nodes),
        (Some(nodes), Some(weights)) => {
            if weights.len() != nodes.len() {
                return Err(PyValueError::new_err(format!(
                    "{} weights for {} nodes: give one per node",
                    weights.len(),
                    nodes.len()
                )));
            }
            if weights.contains(&0) {
                return Err(PyValueError::new_err("every weight must be at least 1"));
            }
            spec = spec.on_weighted_nodes(nodes.into_iter().zip(weights));
        }
        (None, None) => {}
    }
    if let Some(unit) = p.stripe {
        spec = spec.stripe(unit);
    }
    if let Some(name) = p.name {
        spec = spec.named(name);
    }
    if p.persistent {
        spec = spec.persistent();
    }
    if p.shared {
        spec = spec.shared();
    }
    if let Some(index) = p.gpu {
        spec = spec.gpu(index);
    }
    if let Some(copies) = p.replicas {
        spec = spec.replicas(copies);
    }
    if let Some(fabric) = p.fabric {
        let fabric = Fabric::parse(&fabric).map_err(|e| PyValueError::new_err(e.to_string()))?;
        spec = spec.fabric(fabric);
    }
    Ok(spec)
}
