//! GCE custom machine types, parsed from the name rather than looked up.
//!
//! `[FAMILY-]custom-VCPUS-MEMORY_MIB[-ext]` (no family = N1), and E2's shared-core
//! `e2-custom-(micro|small|medium)-MEMORY_MIB`, which have 2 vCPUs.

/// A parsed custom machine type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Custom {
    pub cpus: i64,
    pub memory_mib: i64,
}

fn number(text: &str, what: &'static str) -> Result<i64, &'static str> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(what);
    }
    match text.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(what),
    }
}

/// `None` when the name is not a custom type at all; `Some(Err(why))` when it looks like one but
/// cannot be read.
pub fn parse_custom(name: &str) -> Option<Result<Custom, &'static str>> {
    let rest = if let Some(rest) = name.strip_prefix("custom-") {
        rest
    } else {
        let (family, rest) = name.split_once("-custom-")?;
        if family.is_empty() || family.contains('-') {
            return Some(Err("the family prefix must be one word such as n2"));
        }
        if family == "e2" {
            for shared in ["micro-", "small-", "medium-"] {
                if let Some(memory) = rest.strip_prefix(shared) {
                    return Some(
                        number(memory, "the memory must be a whole number of MiB")
                            .map(|memory_mib| Custom { cpus: 2, memory_mib }),
                    );
                }
            }
        }
        rest
    };
    let rest = rest.strip_suffix("-ext").unwrap_or(rest);
    let Some((cpus, memory)) = rest.split_once('-') else {
        return Some(Err("expected CPUS-MEMORY_MIB after custom-"));
    };
    Some(
        number(cpus, "the vCPU count must be a positive whole number").and_then(|cpus| {
            number(memory, "the memory must be a whole number of MiB")
                .map(|memory_mib| Custom { cpus, memory_mib })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_names() {
        assert_eq!(
            parse_custom("custom-6-20480"),
            Some(Ok(Custom {
                cpus: 6,
                memory_mib: 20480
            }))
        );
        assert_eq!(
            parse_custom("n2-custom-8-16384"),
            Some(Ok(Custom {
                cpus: 8,
                memory_mib: 16384
            }))
        );
        assert_eq!(
            parse_custom("n2d-custom-2-65536-ext"),
            Some(Ok(Custom {
                cpus: 2,
                memory_mib: 65536
            }))
        );
        assert_eq!(
            parse_custom("e2-custom-micro-1024"),
            Some(Ok(Custom {
                cpus: 2,
                memory_mib: 1024
            }))
        );
        assert_eq!(
            parse_custom("e2-custom-medium-4096"),
            Some(Ok(Custom {
                cpus: 2,
                memory_mib: 4096
            }))
        );
        assert_eq!(
            parse_custom("e2-custom-4-8192"),
            Some(Ok(Custom {
                cpus: 4,
                memory_mib: 8192
            }))
        );
        assert_eq!(parse_custom("n2-standard-8"), None);
        assert!(matches!(parse_custom("custom-6"), Some(Err(_))));
        assert!(matches!(parse_custom("custom-x-1024"), Some(Err(_))));
        assert!(matches!(parse_custom("custom-0-1024"), Some(Err(_))));
        assert!(matches!(
            parse_custom("custom-4-99999999999999999999"),
            Some(Err(_))
        ));
        assert!(matches!(parse_custom("e2-custom-micro-"), Some(Err(_))));
    }
}
