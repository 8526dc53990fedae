//! Stateless packet mechanics shared by Spillway's XDP programs: bounds-checked access,
//! header layouts, parsing, checksums, encapsulation, next-hop lookup and ICMP "too big"
//! answers.
//!
//! Invariants: nothing here panics, allocates or loops without a constant bound; every
//! packet access goes through [`packet`], which proves the bounds to the verifier. Maps
//! live with the program that owns them (`src/bin/*`), so each object carries only its own.
#![no_std]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod atomic;
pub mod csum;
pub mod encap;
pub mod fib;
pub mod fragment;
pub mod headers;
pub mod icmp;
pub mod packet;
pub mod parse;
