//! Adopting blocks a lower tier's store kept across a restart.

use kvbm_tiers::{TierConfig, TierError, TierId};

use crate::support::{chain, device, tiers};

#[test]
fn adopted_blocks_are_matchable_in_their_tier_at_once() {
    let gpu = device(4);
    let mut tiers = tiers(
        &gpu,
        vec![TierConfig::new("CPU", 2), TierConfig::new("DISK", 8)],
    );
    let disk = TierId::lower(1).unwrap();
    let hashes = chain(7, 5);
    // Children first, a repeat: parents go first, the repeat once.
    let mut given = hashes.clone();
    given.reverse();
    given.push(hashes[0]);
    assert_eq!(tiers.adopt(disk, &given).unwrap(), 5);
    assert_eq!(tiers.lookup(&hashes), [0, 0, 5]);
    assert_eq!(tiers.stats(disk).unwrap().adopted_blocks, 5);
    // Held already: nothing more.
    assert_eq!(tiers.adopt(disk, &hashes).unwrap(), 0);
    // A tier takes what it has room for.
    assert_eq!(tiers.adopt(disk, &chain(9, 20)).unwrap(), 8);
    tiers.audit().unwrap();
}

#[test]
fn only_a_lower_tier_adopts() {
    let gpu = device(4);
    let mut tiers = tiers(&gpu, vec![TierConfig::new("CPU", 2)]);
    assert_eq!(
        tiers.adopt(TierId::DEVICE, &chain(1, 1)),
        Err(TierError::UnknownTier(TierId::DEVICE))
    );
    let missing = TierId::lower(3).unwrap();
    assert_eq!(
        tiers.adopt(missing, &chain(1, 1)),
        Err(TierError::UnknownTier(missing))
    );
    assert_eq!(tiers.adopt(TierId::lower(0).unwrap(), &[]), Ok(0));
}
