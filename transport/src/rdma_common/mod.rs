//! The parts of the `rdma` backend that need no device, compiled in every build so
//! they are unit-tested everywhere (CI has no RDMA hardware):
//! - [`sysfs`]: devices, ports, link layers and GIDs read from `/sys/class/infiniband`,
//!   and the choice of GID for RoCE v2;
//! - [`conn_data`]: the connection data both sides exchange out of band, and path MTU
//!   negotiation;
//! - [`credits`]: credit-based flow control of SEND/RECV;
//! - [`qp`]: the states of a queue pair's setup and the attributes of each step.

pub mod conn_data;
pub mod credits;
pub mod qp;
pub mod sysfs;

/// The symbolic name of an errno value that verbs calls report (`ENOSYS` for 38).
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        1 => "EPERM",
        2 => "ENOENT",
        5 => "EIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        16 => "EBUSY",
        19 => "ENODEV",
        22 => "EINVAL",
        24 => "EMFILE",
        28 => "ENOSPC",
        38 => "ENOSYS",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        _ => "errno",
    }
}

#[cfg(test)]
mod tests {
    use super::errno_name;
    use crate::TransportError;

    #[test]
    fn verbs_errors_name_the_call_and_the_errno() {
        assert_eq!(errno_name(38), "ENOSYS");
        let e = TransportError::Verbs {
            call: "ibv_get_device_list",
            errno: 38,
        };
        let text = e.to_string();
        assert!(text.starts_with("ibv_get_device_list failed: "), "{text}");
        assert!(
            text.contains("ENOSYS") && text.contains("os error 38"),
            "{text}"
        );
    }
}
