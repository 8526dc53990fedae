//! QUIC-LB connection ids for QUIC servers behind Spillway.
//!
//! A QUIC server behind a balancer that routes by connection id must issue ids that carry its
//! server id. [`QuicLbGenerator`] is a quinn [`ConnectionIdGenerator`] that does, in the
//! encodings of draft-ietf-quic-load-balancers-21: plaintext (`spillway_common::quic_lb`), or
//! encrypted with the configuration's key ([`CidCipher`], both of the draft's modes), so that
//! only the balancer can read which server an id names:
//!
//! ```no_run
//! # use std::sync::Arc;
//! use spillway_quic_lb::{QuicLbConfig, QuicLbGenerator, QuicLbKey, ServerId};
//! let cfg = QuicLbConfig { config_id: 0, server_id_len: 2, nonce_len: 6, flags: 0 };
//! let key = QuicLbKey::from_file_text(&std::fs::read_to_string("/etc/spillway/quic-0.key").unwrap()).unwrap();
//! let generator = QuicLbGenerator::encrypted(cfg, "0a01".parse::<ServerId>().unwrap(), &key).unwrap();
//! let mut endpoint = quinn::EndpointConfig::default();
//! endpoint.cid_generator(move || Box::new(generator.clone()));
//! ```

mod cipher;
mod generator;
mod nonce;

pub use cipher::{CidCipher, Encryption};
pub use generator::{QuicLbGenerator, RotateError};
pub use spillway_common::quic_lb::key::{KeyError, QuicLbKey};
pub use spillway_common::quic_lb::{CidError, ConfigError, MAX_CID_LEN, QUIC_LB_F_SELF_LEN, QuicLbConfig, ServerId};
