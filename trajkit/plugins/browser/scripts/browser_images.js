// The page's images for browser_get_images: the first `limit` <img> elements with a source,
// each with its absolute URL (data: URLs cut short), alt text and rendered size.
(limit) =>
  Array.from(document.images)
    .filter((img) => img.currentSrc || img.src)
    .slice(0, limit)
    .map((img) => {
      const src = img.currentSrc || img.src;
      return {
        src: src.startsWith("data:") ? src.slice(0, 64) + "…" : src,
        alt: img.alt || "",
        width: img.width,
        height: img.height,
      };
    })
