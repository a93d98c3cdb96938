//! Label enums: the small closed sets that name a counter's series, such as
//! why a connect failed or what a health check found.
//!
//! Each is declared once with `labels!`: its variants and the text each
//! one exports as. The macro gives the enum `ALL` (in declaration order),
//! `COUNT`, `as_str` and `index`, so a counter array is sized
//! `[AtomicU64; Why::COUNT]` and indexed `why.index()` everywhere, and the
//! metrics export walks `ALL` through the [`Label`] trait.

/// A label enum, as `labels!` declares it.
pub trait Label: Copy + 'static {
    /// Every value, in declaration order (the order of its counters).
    const ALL: &'static [Self];
    /// The text a metric label carries.
    fn as_str(self) -> &'static str;
    /// The value's position in [`Label::ALL`].
    fn index(self) -> usize;
}

/// Declares a label enum: each variant with the label text it exports as.
///
/// ```ignore
/// labels! {
///     /// Why a connect failed.
///     pub enum ConnectFailure {
///         Refused => "refused",
///         Timeout => "timeout",
///     }
/// }
/// ```
#[macro_export]
macro_rules! labels {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];
            /// How many values there are.
            pub const COUNT: usize = Self::ALL.len();

            /// The text a metric label carries.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text ),+
                }
            }

            /// The value's position in `ALL`: the index of its counter.
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        impl $crate::label::Label for $name {
            const ALL: &'static [Self] = &$name::ALL;

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }

            fn index(self) -> usize {
                $name::index(self)
            }
        }

        impl ::std::fmt::Display for $name {
            // `pad`, so a width or alignment applies (tables line up).
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    labels! {
        /// A test set.
        enum Colour {
            Red => "red",
            /// With a doc.
            DeepBlue => "deep_blue",
        }
    }

    #[test]
    fn all_count_text_and_index_agree() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::DeepBlue]);
        assert_eq!(Colour::COUNT, 2);
        assert_eq!(Colour::DeepBlue.as_str(), "deep_blue");
        assert_eq!(Colour::DeepBlue.to_string(), "deep_blue");
        assert_eq!(format!("{:>5}|", Colour::Red), "  red|");
        for (i, c) in Colour::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(<Colour as Label>::ALL[i], *c);
        }
    }
}
