// Older messages of a bounded snapshot: pages loaded on scroll-up, kept across refetches.

/**
 * A snapshot holds only the thread's last messages (`page.before` is the cursor of older
 * ones). This keeps the older pages a reader loaded and merges them in front of each new
 * snapshot's window. When a refetch's window no longer joins the loaded pages (history was
 * rewritten, or it moved too far), the pages are dropped: correct first, complete on scroll.
 */
export class OlderMessages {
  constructor() {
    this.older = []; // messages before the current window, oldest first
    this.window = []; // the last snapshot's messages
    this.cursor = null; // page.before of the oldest loaded page (null: nothing older)
    this.loading = false;
  }

  /** The messages to show for `snapshot`: loaded older pages, then its window. */
  absorb(snapshot) {
    const next = (snapshot && snapshot.messages) || [];
    if (next === this.window) return this.messages();
    const first = next.length ? next[0].id : null;
    const k = first === null ? -1 : this.window.findIndex((m) => m.id === first);
    if (this.window.length === 0 && this.older.length === 0) {
      this.cursor = snapshot && snapshot.page ? snapshot.page.before : null;
    } else if (k >= 0) {
      this.older = this.older.concat(this.window.slice(0, k)); // they slid out of the window
    } else {
      this.older = []; // the window does not join what was loaded: start over from it
      this.cursor = snapshot && snapshot.page ? snapshot.page.before : null;
    }
    this.window = next;
    return this.messages();
  }

  messages() {
    const inWindow = new Set(this.window.map((m) => m.id));
    return this.older.filter((m) => !inWindow.has(m.id)).concat(this.window);
  }

  get hasMore() {
    return this.cursor !== null && this.cursor !== undefined;
  }

  /** Put an older page (a snapshot fetched with ?before=) in front of what is loaded. */
  prepend(page) {
    const known = new Set(this.messages().map((m) => m.id));
    const fresh = ((page && page.messages) || []).filter((m) => !known.has(m.id));
    this.older = fresh.concat(this.older);
    this.cursor = page && page.page ? page.page.before : null;
  }
}
