//! Enum tables derived from the enums themselves: no variant can be left out of an
//! `ALL`, and none listed twice.

/// Every variant of an enum that derives `strum::VariantArray`, as an array of its
/// `strum::EnumCount` length, in declaration order: `pub const ALL: [T; T::COUNT] =
/// every(T::VARIANTS)`, so a variant added later is in `ALL` without anyone listing it
/// (and a length that disagrees fails to compile).
pub const fn every<T: Copy, const N: usize>(variants: &[T]) -> [T; N] {
    match variants.first_chunk::<N>() {
        Some(all) if variants.len() == N => *all,
        _ => panic!("an enum's every variant, exactly once"),
    }
}
