//! QR codes of short URLs (`GET <short_base path>/<code>/qr?size=&format=&margin=`), rendered
//! with the `qrcode` crate: PNG (8-bit grey, through `png`) or SVG.

use qrcode::{Color, EcLevel, QrCode};

/// Smallest and largest `size` (pixels of a side).
pub const SIZE_RANGE: (u32, u32) = (50, 2000);
/// Largest `margin` (modules of quiet zone on each side).
pub const MAX_MARGIN: u32 = 20;

/// Image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// PNG.
    Png,
    /// SVG.
    Svg,
}

/// A validated QR request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Pixels of a side (the image is at most this, a whole number of pixels per module).
    pub size: u32,
    /// Image format.
    pub format: Format,
    /// Quiet zone, in modules.
    pub margin: u32,
}

/// Parses `size` (default 300), `format` (png, default, or svg) and `margin` (default 1).
pub fn params(query: &str) -> Result<Params, String> {
    let mut p = Params { size: 300, format: Format::Png, margin: 1 };
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "size" => {
                p.size = v
                    .parse()
                    .ok()
                    .filter(|s| (SIZE_RANGE.0..=SIZE_RANGE.1).contains(s))
                    .ok_or_else(|| format!("size: `{v}` must be {} to {} pixels", SIZE_RANGE.0, SIZE_RANGE.1))?
            }
            "margin" => {
                p.margin = v
                    .parse()
                    .ok()
                    .filter(|m| *m <= MAX_MARGIN)
                    .ok_or_else(|| format!("margin: `{v}` must be 0 to {MAX_MARGIN} modules"))?
            }
            "format" => {
                p.format = match &*v {
                    "png" => Format::Png,
                    "svg" => Format::Svg,
                    _ => return Err(format!("format: `{v}` must be png or svg")),
                }
            }
            // Ignored, as on the management API (a cache buster, a tracking tag, a credential).
            _ => {}
        }
    }
    Ok(p)
}

/// The image of `text`: its content type and bytes.
pub fn render(text: &str, p: Params) -> Result<(&'static str, Vec<u8>), String> {
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M).map_err(|e| e.to_string())?;
    let width = code.width() as u32;
    let colors = code.to_colors();
    let modules = width + 2 * p.margin;
    // Whole pixels per module (crisp edges), the pixels left over added to the quiet zone
    // around it, so that the image is exactly `size` wide (as Shlink's are) unless even one
    // pixel per module does not fit.
    let scale = (p.size / modules).max(1);
    let side = p.size.max(modules * scale);
    let offset = (side - modules * scale) / 2;
    let dark = |x: u32, y: u32| -> bool {
        x >= p.margin
            && y >= p.margin
            && x < p.margin + width
            && y < p.margin + width
            && colors[((y - p.margin) * width + (x - p.margin)) as usize] == Color::Dark
    };
    match p.format {
        Format::Svg => {
            let mut path = String::new();
            for y in 0..modules {
                for x in 0..modules {
                    if dark(x, y) {
                        let (px, py) = (offset + x * scale, offset + y * scale);
                        path.push_str(&format!("M{px},{py}h{scale}v{scale}h-{scale}z"));
                    }
                }
            }
            let svg = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{side}\" height=\"{side}\" viewBox=\"0 0 {side} {side}\" shape-rendering=\"crispEdges\"><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/><path fill=\"#000\" d=\"{path}\"/></svg>\n"
            );
            Ok(("image/svg+xml", svg.into_bytes()))
        }
        Format::Png => {
            let module = |px: u32| px.checked_sub(offset).map(|p| p / scale).filter(|m| *m < modules);
            let mut pixels = Vec::with_capacity((side * side) as usize);
            for y in 0..side {
                for x in 0..side {
                    let on = module(x).zip(module(y)).is_some_and(|(mx, my)| dark(mx, my));
                    pixels.push(if on { 0u8 } else { 255u8 });
                }
            }
            let mut out = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut out, side, side);
                enc.set_color(png::ColorType::Grayscale);
                enc.set_depth(png::BitDepth::Eight);
                let mut w = enc.write_header().map_err(|e| e.to_string())?;
                w.write_image_data(&pixels).map_err(|e| e.to_string())?;
            }
            Ok(("image/png", out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image is `size` pixels wide whatever the module count (the pixels that do not make a
    /// whole module go to the quiet zone), and decodes back to the URL; when not even one pixel
    /// per module fits, it is one pixel per module.
    #[test]
    fn a_png_is_the_size_asked_and_decodes_back_to_the_url() {
        let url = "https://s.example/s/Ab3dEf9h";
        // (A reader needs a quiet zone and more than one pixel per module: the last two are only
        // measured.)
        for (size, margin, side, read) in
            [(300, 2, 300, true), (299, 1, 299, true), (2000, 20, 2000, true), (50, 0, 50, false), (60, 20, 69, false)]
        {
            let (ct, bytes) =
                render(url, Params { size, format: Format::Png, margin }).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(ct, "image/png");
            let dec = png::Decoder::new(std::io::Cursor::new(bytes));
            let mut reader = dec.read_info().unwrap_or_else(|e| panic!("{e}"));
            let mut buf = vec![0; reader.output_buffer_size()];
            let info = reader.next_frame(&mut buf).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((info.width, info.height), (side, side), "size {size} margin {margin}");
            if !read {
                continue;
            }
            let (w, h) = (info.width as usize, info.height as usize);
            let mut img = rqrr::PreparedImage::prepare_from_greyscale(w, h, |x, y| buf[y * w + x]);
            let grids = img.detect_grids();
            assert_eq!(grids.len(), 1, "size {size} margin {margin}");
            let (_, content) = grids[0].decode().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(content, url);
        }
    }

    #[test]
    fn params_are_checked() {
        assert_eq!(params(""), Ok(Params { size: 300, format: Format::Png, margin: 1 }));
        assert_eq!(params("size=120&format=svg&margin=0"), Ok(Params { size: 120, format: Format::Svg, margin: 0 }));
        for bad in ["size=10", "size=5000", "size=x", "format=gif", "margin=21"] {
            assert!(params(bad).is_err(), "{bad}");
        }
        assert_eq!(params("colour=red&size=120"), Ok(Params { size: 120, format: Format::Png, margin: 1 }));
        let (ct, svg) = render("https://s.example/s/x", Params { size: 100, format: Format::Svg, margin: 1 })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ct, "image/svg+xml");
        let svg = String::from_utf8_lossy(&svg);
        assert!(svg.contains("<path fill=\"#000\" d=\"M"));
        assert!(svg.contains("width=\"100\" height=\"100\" viewBox=\"0 0 100 100\""), "{svg}");
    }
}
