//! A number's decimal digits on the stack: header values, names and messages written without
//! an allocation or the formatting machinery (shared by the data plane and the snapshot builder).

/// A number's decimal digits, on the stack (header values without an allocation).
#[derive(Clone, Copy)]
pub struct Decimal {
    digits: [u8; 20],
    from: usize,
}

impl Decimal {
    /// The digits of `n`.
    pub fn new(mut n: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut from = digits.len();
        loop {
            from -= 1;
            digits[from] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { digits, from }
    }

    /// Them, as text.
    pub fn as_str(&self) -> &str {
        // ASCII digits only: always UTF-8.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// Them, as ASCII.
    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[self.from..]
    }
}
