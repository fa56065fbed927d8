//! The device an example opens when it is given an address: the one
//! named, or else the first RDMA device, said aloud so that what is
//! printed is what is opened.
#![cfg(feature = "verbs")]

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The name of the device for a run over `--listen` or `--connect`:
/// `named`, or without one the first RDMA device. The soft device lives
/// in one process, so it is refused here; `usage` ends that message, and
/// `other_ways` (say "use --cm, ") goes into the one for a machine with no
/// device.
pub fn for_address(named: Option<&str>, usage: &str, other_ways: &str) -> Result<String, BoxError> {
    match named {
        Some("soft") => Err(format!(
            "--listen and --connect need a real device: the soft device lives in one process; {usage}"
        )
        .into()),
        Some(name) => Ok(name.to_string()),
        None => {
            let names = rdma_ring::backend::verbs::device_names()?;
            let first = names.first().ok_or_else(|| {
                format!(
                    "no RDMA device on this machine: name one with --device, {other_ways}or leave out the address for the soft device"
                )
            })?;
            println!("no --device given: using {first}, the first RDMA device");
            Ok(first.clone())
        }
    }
}
