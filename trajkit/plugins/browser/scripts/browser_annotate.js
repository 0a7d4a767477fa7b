// Draw each interactive element's ref over the page for a screenshot (browser_vision with
// annotate), or remove the drawing when given null. Boxes are viewport coordinates from the
// accessibility snapshot: [{ref, x, y, width, height}].
(labels) => {
  const id = "trajkit-annotations";
  document.getElementById(id)?.remove();
  if (!labels) return 0;
  const layer = document.createElement("div");
  layer.id = id;
  layer.style.cssText = "position:fixed;inset:0;pointer-events:none;z-index:2147483647";
  for (const { ref, x, y, width, height } of labels) {
    const box = document.createElement("div");
    box.style.cssText =
      `position:fixed;left:${x}px;top:${y}px;width:${width}px;height:${height}px;` +
      "outline:2px solid #d00;box-sizing:border-box";
    const tag = document.createElement("span");
    tag.textContent = ref;
    tag.style.cssText =
      "position:absolute;left:0;top:-1px;transform:translateY(-100%);background:#d00;color:#fff;" +
      "font:bold 11px/13px monospace;padding:0 2px";
    box.appendChild(tag);
    layer.appendChild(box);
  }
  document.documentElement.appendChild(layer);
  return labels.length;
}
