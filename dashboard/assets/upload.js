// Trace uploads on the Runs page: the file is sent as the body of one POST to the upload route
// (dashboard/uploads.py), which streams it to disk; then the page reloads with the new run selected.
(function () {
  "use strict";

  function status(text, isError) {
    var el = document.getElementById("runs-upload-status");
    if (el) {
      el.textContent = text;
      el.className = isError ? "error" : "note";
    }
  }

  function upload(file) {
    var zone = document.getElementById("runs-drop");
    if (!file || !zone) {
      return;
    }
    var url = zone.getAttribute("data-upload-url") + "?name=" + encodeURIComponent(file.name);
    status("uploading " + file.name + " (" + (file.size / 1048576).toFixed(1) + " MiB)…", false);
    fetch(url, {method: "POST", body: file, headers: {"Content-Type": "application/octet-stream"}})
      .then(function (r) {
        return r.json().catch(function () {
          return {error: file.name + ": upload failed (HTTP " + r.status + ")"};
        });
      })
      .then(function (body) {
        if (body.error || !body.run) {
          status(body.error || "upload failed", true);
          return;
        }
        status("added " + body.label, false);
        window.location.assign(window.location.pathname + "?run=" + encodeURIComponent(body.run));
      })
      .catch(function (err) {
        status(file.name + ": upload failed (" + err + ")", true);
      });
  }

  document.addEventListener("click", function (e) {
    if (!e.target.closest || !e.target.closest("#runs-choose")) {
      return;
    }
    e.preventDefault();
    var input = document.createElement("input");
    input.type = "file";
    input.id = "runs-file";
    input.style.display = "none";
    input.addEventListener("change", function () {
      upload(input.files[0]);
      input.remove();
    });
    document.body.appendChild(input);
    input.click();
  });
  document.addEventListener("dragover", function (e) {
    if (e.target.closest && e.target.closest("#runs-drop")) {
      e.preventDefault();
    }
  });
  document.addEventListener("drop", function (e) {
    if (e.target.closest && e.target.closest("#runs-drop")) {
      e.preventDefault();
      upload(e.dataTransfer.files[0]);
    }
  });
})();
