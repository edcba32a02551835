//! The voters against real processes: bare masters behind tenure protection ([`tenure`]),
//! Sentinel groups ([`sentinel`]), Redis Clusters ([`cluster`], feature `cluster`), TLS
//! ([`tls`], feature `tls`), masters that may evict ([`eviction`]), the test kit's
//! topologies themselves ([`topology`]), the operator's verbs on every kind of voter
//! ([`operate`], feature `cluster`), and the backend conformance suite
//! ([`conformance`]): one set of checks over every kind of node.

#[cfg(feature = "cluster")]
mod cluster;
mod conformance;
mod eviction;
#[cfg(feature = "cluster")]
mod operate;
mod sentinel;
mod sentinel_group;
mod tenure;
mod tls;
mod topology;
mod wake;
#[cfg(feature = "cluster")]
mod wake_cluster;
#[cfg(feature = "cluster")]
mod wake_cluster_leak;
