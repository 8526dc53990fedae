//! `--outer-src` / `--outer-src6`: the encapsulation's source address, optionally a prefix
//! whose host bits the balancer fills from the flow hash (spreading the backends' RSS).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use spillway_common::addr::to_words;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OuterSrcError {
    #[error("outer source {input:?}: expected an IPv4 address or prefix, e.g. 10.0.0.5 or 10.0.0.0/24")]
    BadV4 { input: String },
    #[error("outer source {input:?}: expected an IPv6 address or prefix, e.g. fd00::5 or fd00::/112")]
    BadV6 { input: String },
    #[error("outer source {input:?}: prefix /{prefix} leaves more than 32 host bits; use /96 or longer")]
    V6PrefixTooShort { input: String, prefix: u8 },
}

/// An IPv4 outer source: `prefix` leading bits are fixed, the rest come from the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OuterSrc4 {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

/// An IPv6 outer source; at most the last 32 bits may come from the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OuterSrc6 {
    pub addr: Ipv6Addr,
    pub prefix: u8,
}

/// `addr` or `addr/prefix` with `prefix` in `min..=max`.
fn split<A: FromStr>(input: &str, min: u8, max: u8) -> Option<(A, u8)> {
    let (addr, prefix) = match input.split_once('/') {
        Some((addr, prefix)) => (addr, prefix.parse().ok().filter(|p| (min..=max).contains(p))?),
        None => (input, max),
    };
    Some((addr.parse().ok()?, prefix))
}

impl FromStr for OuterSrc4 {
    type Err = OuterSrcError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = split(input, 1, 32).ok_or_else(|| OuterSrcError::BadV4 { input: input.to_owned() })?;
        Ok(Self { addr, prefix })
    }
}

impl FromStr for OuterSrc6 {
    type Err = OuterSrcError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = split(input, 1, 128).ok_or_else(|| OuterSrcError::BadV6 { input: input.to_owned() })?;
        if prefix < 96 {
            return Err(OuterSrcError::V6PrefixTooShort { input: input.to_owned(), prefix });
        }
        Ok(Self { addr, prefix })
    }
}

/// Host bits of the last 32-bit word for a prefix ending in that word, in network order.
fn host_mask(prefix_bits_in_word: u8) -> u32 {
    u32::MAX.checked_shr(u32::from(prefix_bits_in_word)).unwrap_or(0).to_be()
}

impl OuterSrc4 {
    pub fn host(addr: Ipv4Addr) -> Self {
        Self { addr, prefix: 32 }
    }

    /// `(LbConfig.outer_src_v4, LbConfig.outer_src_v4_hostmask)`, network order.
    pub fn words(&self) -> (u32, u32) {
        let mask = host_mask(self.prefix);
        (to_words(IpAddr::V4(self.addr)).0[0] & !mask, mask)
    }
}

impl OuterSrc6 {
    pub fn host(addr: Ipv6Addr) -> Self {
        Self { addr, prefix: 128 }
    }

    /// `(LbConfig.outer_src_v6, LbConfig.outer_src_v6_hostmask)`, network order.
    pub fn words(&self) -> ([u32; 4], u32) {
        let mask = host_mask(self.prefix - 96);
        let mut words = to_words(IpAddr::V6(self.addr)).0;
        words[3] &= !mask;
        (words, mask)
    }
}

impl fmt::Display for OuterSrc4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Display for OuterSrc6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_host_and_prefix() {
        let host: OuterSrc4 = "10.0.0.5".parse().unwrap();
        assert_eq!(host, OuterSrc4::host("10.0.0.5".parse().unwrap()));
        let (addr, mask) = host.words();
        assert_eq!((addr.to_ne_bytes(), mask), ([10, 0, 0, 5], 0));
        let (addr, mask) = "10.0.0.7/24".parse::<OuterSrc4>().unwrap().words();
        assert_eq!((addr.to_ne_bytes(), mask.to_ne_bytes()), ([10, 0, 0, 0], [0, 0, 0, 255]));
        let (_, mask) = "10.0.0.0/20".parse::<OuterSrc4>().unwrap().words();
        assert_eq!(mask.to_ne_bytes(), [0, 0, 0x0f, 0xff]);
        for bad in ["10.0.0.0/0", "10.0.0.0/33", "fd00::1", "10.0.0/24", "10.0.0.1/"] {
            assert_eq!(bad.parse::<OuterSrc4>(), Err(OuterSrcError::BadV4 { input: bad.into() }));
        }
    }

    #[test]
    fn v6_host_bits_stay_in_the_last_word() {
        let (words, mask) = "fd00::5".parse::<OuterSrc6>().unwrap().words();
        assert_eq!((words, mask), (to_words("fd00::5".parse().unwrap()).0, 0));
        let (words, mask) = "fd00::1:2:3/112".parse::<OuterSrc6>().unwrap().words();
        assert_eq!(words, to_words("fd00::1:2:0".parse().unwrap()).0);
        assert_eq!(mask.to_ne_bytes(), [0, 0, 0xff, 0xff]);
        assert_eq!("fd00::/96".parse::<OuterSrc6>().unwrap().words().1, u32::MAX);
        assert_eq!("fd00::/64".parse::<OuterSrc6>(), Err(OuterSrcError::V6PrefixTooShort { input: "fd00::/64".into(), prefix: 64 }));
        assert!(matches!("10.0.0.1".parse::<OuterSrc6>(), Err(OuterSrcError::BadV6 { .. })));
    }
}
