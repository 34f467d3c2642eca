//! Keyword enums: a field whose value is one of a few words (`algorithm`,
//! `per`, `on_full`), stored in the shared-memory file as one byte.
//!
//! [`keyword_enum!`] declares such an enum once — variant, byte, word — and
//! derives from that single list everything that used to be written out per
//! type: `ALL`, `as_str`, `from_u8`, `parse`, `EXPECTED` (the words for an
//! error message) and `Display`. `FromStr` stays with each type: its error
//! names the field, and some accept aliases (`per: s`, `per: minutes`).

/// See the [module documentation](self).
macro_rules! keyword_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $byte:literal => $word:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $byte ),+
        }

        impl $name {
            /// Every value, in the order of their bytes.
            pub const ALL: [$name; [$($byte),+].len()] = [$($name::$variant),+];
            /// The words, comma-separated (error messages).
            pub const EXPECTED: &'static str = $crate::core::model::keyword::keyword_enum!(@join $($word),+);

            /// The value's word, as written in the store, the API and the CLI.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $word ),+
                }
            }

            /// The value of a byte of the shared-memory file (`None`: not one).
            pub fn from_u8(v: u8) -> Option<$name> {
                $name::ALL.into_iter().find(|k| *k as u8 == v)
            }

            /// The value of a word (exactly as [`Self::as_str`] writes it).
            pub fn parse(word: &str) -> Option<$name> {
                $name::ALL.into_iter().find(|k| k.as_str() == word)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
    (@join $first:literal $(, $rest:literal)*) => {
        concat!($first $(, ", ", $rest)*)
    };
}

pub(crate) use keyword_enum;

#[cfg(test)]
mod tests {
    keyword_enum! {
        /// A test keyword.
        enum Colour {
            Red = 1 => "red",
            /// Not 2: bytes need not be dense.
            Blue = 3 => "blue",
        }
    }

    #[test]
    fn one_list_gives_bytes_words_and_the_message() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::Blue]);
        assert_eq!(Colour::EXPECTED, "red, blue");
        assert_eq!(Colour::from_u8(3), Some(Colour::Blue));
        assert_eq!(Colour::from_u8(2), None);
        assert_eq!(Colour::parse("red"), Some(Colour::Red));
        assert_eq!(Colour::parse("Red"), None);
        assert_eq!(Colour::Blue.to_string(), "blue");
    }
}
