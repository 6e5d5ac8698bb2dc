// Presence of one thread: who is here, who types, who reviews which action (docs/protocol.md,
// "Presence"). Pure: no DOM, no network.

export interface PresenceMember {
  subject: string;
  role?: string;
  name?: string;
  connections?: number;
  typing?: boolean;
  reviewing?: string | null;
  [key: string]: unknown;
}

export type PresenceMembers = Record<string, PresenceMember>;

interface PresenceFrame {
  type?: unknown;
  members?: unknown;
  member?: unknown;
  subject?: unknown;
}

/** The member map after one presence frame (a new object; unknown frames change nothing). */
export function applyPresence(members: PresenceMembers, frame: unknown): PresenceMembers {
  if (!frame || typeof frame !== 'object') return members;
  const f = frame as PresenceFrame;
  if (f.type === 'presence') {
    const next: PresenceMembers = {};
    for (const m of Array.isArray(f.members) ? (f.members as PresenceMember[]) : []) if (m && m.subject) next[m.subject] = m;
    return next;
  }
  const member = f.member as PresenceMember | undefined;
  if ((f.type === 'presence.join' || f.type === 'presence.update') && member && member.subject) {
    return { ...members, [member.subject]: member };
  }
  if (f.type === 'presence.leave' && typeof f.subject === 'string') {
    const next = { ...members };
    delete next[f.subject];
    return next;
  }
  return members;
}

export interface PresenceView {
  here: { subject: string; name: string; role?: string; connections: number; me: boolean }[];
  typing: string[];
  reviewing: Record<string, string[]>;
}

/**
 * What to show: everyone here (me first, then by name), the names of others typing, and per
 * action id the names of others reviewing it.
 */
export function presenceView(members: PresenceMembers | null | undefined, me: string | null | undefined): PresenceView {
  const all = Object.values(members || {});
  const here = all
    .map((m) => ({ subject: m.subject, name: m.name || m.subject, role: m.role, connections: m.connections || 1, me: m.subject === me }))
    .sort((a, b) => (a.me === b.me ? a.name.localeCompare(b.name) : a.me ? -1 : 1));
  const others = all.filter((m) => m.subject !== me);
  const typing = others
    .filter((m) => m.typing)
    .map((m) => m.name || m.subject)
    .sort();
  const reviewing: Record<string, string[]> = {};
  for (const m of others) {
    if (m.reviewing) (reviewing[m.reviewing] = reviewing[m.reviewing] || []).push(m.name || m.subject);
  }
  for (const names of Object.values(reviewing)) names.sort();
  return { here, typing, reviewing };
}
