// Small UI behaviour on top of htmx: autoscroll, textarea auto-grow, keyboard, copy buttons,
// a preset's model shown in the picker.
// Nothing here is needed to read a chat or post a message; without it the forms still work
// (the Copy buttons of messages and replies stay hidden: they need this file to do anything).
(function () {
  "use strict";

  var STICK_PX = 80; // "at the bottom" tolerance: scrolling up further pauses autoscroll
  var stick = true;

  function messages() { return document.getElementById("conversation"); }

  function atBottom(el) {
    return el.scrollHeight - el.scrollTop - el.clientHeight < STICK_PX;
  }

  function scrollDown(force) {
    var el = messages();
    if (el && (stick || force)) { el.scrollTop = el.scrollHeight; }
  }

  function grow(area) {
    area.style.height = "auto";
    area.style.height = area.scrollHeight + 2 + "px";
  }

  function growAll(root) {
    var areas = (root || document).querySelectorAll("textarea[data-autogrow]");
    for (var i = 0; i < areas.length; i++) { grow(areas[i]); }
  }

  function copyText(text, button) {
    function done(ok) {
      button.textContent = ok ? "Copied" : "Copy failed";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(false); });
      return;
    }
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "copy-buffer";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    done(ok);
  }

  function setAlert(text) {
    var alert = document.getElementById("composer-alert");
    if (alert) { alert.textContent = text; }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = messages();
    if (el) {
      el.addEventListener("scroll", function () { stick = atBottom(el); }, { passive: true });
    }
    growAll(document);
    revealCopyButtons(document);
    scrollDown(true);
  });

  document.addEventListener("input", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && t.hasAttribute("data-autogrow")) { grow(t); }
  });

  document.addEventListener("keydown", function (event) {
    var t = event.target;
    if (event.key === "Enter" && !event.shiftKey && !event.altKey && !event.ctrlKey &&
        !event.metaKey && !event.isComposing && t instanceof HTMLTextAreaElement &&
        t.hasAttribute("data-enter-sends") && t.form) {
      event.preventDefault();
      t.form.requestSubmit();
      return;
    }
    // Ctrl+K (Cmd+K on macOS) jumps to the search box; preventDefault keeps the
    // browser's own Ctrl+K (focus its address bar's search) from firing as well.
    if ((event.ctrlKey || event.metaKey) && !event.altKey && !event.shiftKey &&
        (event.key === "k" || event.key === "K")) {
      var box = document.getElementById("search-box");
      if (box) { event.preventDefault(); box.focus(); box.select(); }
      return;
    }
    if (event.key === "Escape") {
      var stop = document.querySelector("form.stop-form button");
      if (stop) { event.preventDefault(); stop.click(); }
    }
  });

  // What a Copy button copies: a code block's code, a reply's Markdown source (kept in a
  // <template> so it is never rendered) or a user message's text as typed.
  function copySource(button) {
    if (button.hasAttribute("data-copy-code")) {
      var block = button.closest(".codeblock");
      return block ? block.querySelector("pre code") : null;
    }
    var message = button.closest("[data-role=assistant], [data-role=user]");
    if (!message) { return null; }
    // Direct children only: nothing inside the rendered text can stand in for them.
    var source = message.querySelector(":scope > template.reply-source");
    return source ? source.content : message.querySelector(":scope > .content");
  }

  function revealCopyButtons(root) {
    var buttons = root.querySelectorAll("button[data-copy][hidden]");
    for (var i = 0; i < buttons.length; i++) { buttons[i].hidden = false; }
  }

  document.addEventListener("click", function (event) {
    var button = event.target instanceof Element
      ? event.target.closest("[data-copy-code], [data-copy]") : null;
    var source = button ? copySource(button) : null;
    if (source) { copyText(source.textContent || "", button); }
  });

  // A message just sent: follow the reply from the bottom again.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (elt && elt.id === "composer") { stick = true; }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    growAll(event.target instanceof Element ? event.target : document);
    scrollDown(false);
  });

  // Older messages arrive above the ones being read: keep those where they were, so
  // the next page loads only when the user scrolls up to it.
  var heightBefore = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    var el = messages();
    if (el && target instanceof Element && target.classList.contains("earlier")) {
      heightBefore = el.scrollHeight;
    }
  });
  document.addEventListener("htmx:afterSwap", function () {
    var el = messages();
    if (el && heightBefore !== null) {
      el.scrollTop += el.scrollHeight - heightBefore;
      heightBefore = null;
    }
  });

  // New content from any swap (a request, an out-of-band part, an SSE event such as a
  // finished reply replacing its streaming element): its Copy buttons can work now.
  document.addEventListener("htmx:load", function (event) {
    if (event.target instanceof Element) { revealCopyButtons(event.target); }
  });

  // Streamed text does not settle like a request: follow it as it arrives.
  document.addEventListener("htmx:sseMessage", function () { scrollDown(false); });

  // A preset chosen on the new-chat page shows its model in the Model select (the preset
  // sets it anyway when the message is sent).
  document.addEventListener("change", function (event) {
    var t = event.target;
    if (!(t instanceof HTMLSelectElement) || !t.hasAttribute("data-preset-select")) { return; }
    var option = t.selectedOptions[0];
    var name = option ? option.getAttribute("data-model") : null;
    var picker = document.getElementById("model-select");
    if (picker && name) { picker.value = name; }
  });

  // Files dropped on a message box, or pasted into it, join its form's Attach files input
  // (the form sends them as it sends a chosen file; without JavaScript, choose them there).
  function attachTo(area, files) {
    var form = area.closest("form");
    var input = form ? form.querySelector("input[type=file][data-attach]") : null;
    if (!input || !files || !files.length || typeof DataTransfer === "undefined") { return false; }
    var all = new DataTransfer();
    Array.prototype.forEach.call(input.files, function (f) { all.items.add(f); });
    Array.prototype.forEach.call(files, function (f) { all.items.add(f); });
    input.files = all.files;
    return true;
  }
  document.addEventListener("dragover", function (event) {
    if (event.target instanceof HTMLTextAreaElement && event.dataTransfer &&
        Array.prototype.indexOf.call(event.dataTransfer.types, "Files") >= 0) {
      event.preventDefault();
    }
  });
  document.addEventListener("drop", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && event.dataTransfer &&
        attachTo(t, event.dataTransfer.files)) {
      event.preventDefault();
    }
  });
  document.addEventListener("paste", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && event.clipboardData &&
        event.clipboardData.files.length && attachTo(t, event.clipboardData.files)) {
      event.preventDefault();  // a pasted image is attached, not pasted as its name
    }
  });

  // A message sent takes its files with it: the next one starts with none.
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail && event.detail.elt;
    if (!(form instanceof HTMLFormElement) || !event.detail.successful) { return; }
    form.querySelectorAll("input[type=file][data-attach]").forEach(function (input) {
      input.value = "";
    });
  });

  document.addEventListener("htmx:sendError", function () {
    setAlert("The server could not be reached. Your text is still in the box; try again.");
  });
})();
