//! Every program stays within its verifier budget (`dataplane::verifier::BUDGETS`): a change
//! that multiplies the verifier's walk fails here, long before the kernel's 1M limit refuses
//! the program at load. Needs root.

use spillway_dataplane::verifier::{BUDGETS, verified_insns};

#[test]
fn every_program_stays_within_its_verifier_budget() {
    let counts = verified_insns().unwrap();
    let mut over = Vec::new();
    for ((name, count), (_, budget)) in counts.iter().zip(BUDGETS) {
        let count = count.unwrap_or_else(|| panic!("the kernel does not report {name}'s verified_insns"));
        println!("{name}: {count} verified instructions (budget {budget})");
        if count > budget {
            over.push(format!("{name}: {count} > {budget}"));
        }
    }
    assert!(over.is_empty(), "over the verifier budget: {}", over.join("; "));
}
