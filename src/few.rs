//! A list that holds one element without allocating: most requests have one policy.

use std::ops::{Deref, DerefMut};

/// Zero, one or many values; one is stored inline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Few<T> {
    #[default]
    Zero,
    One(T),
    Many(Vec<T>),
}

impl<T> Few<T> {
    pub(crate) fn push(&mut self, value: T) {
        *self = match std::mem::replace(self, Few::Zero) {
            Few::Zero => Few::One(value),
            Few::One(first) => Few::Many(vec![first, value]),
            Few::Many(mut all) => {
                all.push(value);
                Few::Many(all)
            }
        };
    }
}

impl<T> Deref for Few<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Few::Zero => &[],
            Few::One(one) => std::slice::from_ref(one),
            Few::Many(all) => all,
        }
    }
}

impl<T> DerefMut for Few<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Few::Zero => &mut [],
            Few::One(one) => std::slice::from_mut(one),
            Few::Many(all) => all,
        }
    }
}

impl<T> From<Vec<T>> for Few<T> {
    fn from(mut all: Vec<T>) -> Self {
        match all.len() {
            0 => Few::Zero,
            1 => Few::One(all.pop().expect("one element")),
            _ => Few::Many(all),
        }
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut few = Few::Zero;
        for value in iter {
            few.push(value);
        }
        few
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows() {
        let mut f = Few::Zero;
        assert!(f.is_empty());
        f.push(1);
        assert!(matches!(f, Few::One(1)));
        f.push(2);
        f.push(3);
        assert_eq!(&*f, &[1, 2, 3]);
        assert_eq!(Few::from(vec![7]), Few::One(7));
        let c: Few<u8> = (0..4).collect();
        assert_eq!(c.len(), 4);
    }
}
