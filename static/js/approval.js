// An approval's policy and progress on its card: who may decide, how many must, who did,
// the deadline, and, for a reader who may not decide, why (docs/protocol.md, "Approval policies").

import { h } from './dom.js';

const REFUSALS = {
  forbidden: (role) => `Your role (${role || 'unknown'}) may not decide this action.`,
  requester_excluded: () => 'You requested this: another person must decide it (four-eyes).',
  not_a_decider: () => 'You are not one of the deciders this policy names.',
  already_decided: () => 'You already decided this action; waiting for the others.',
};

/** Whether this reader may decide `a` now, and why not (`permissions.decide`; a server that
 * sends none is judged by role alone, as before policies existed). */
export function decisionOf(a, snapshot, role) {
  const decide = snapshot && snapshot.permissions && snapshot.permissions.decide;
  const entry = decide && decide[a.id];
  if (entry) return { allowed: Boolean(entry.allowed), reason: entry.reason || null };
  const allowed = !role || (a.allowed_roles || []).includes(role);
  return { allowed, reason: allowed ? null : 'forbidden' };
}

export function refusalText(reason, role) {
  const say = REFUSALS[reason];
  return say ? say(role) : `You may not decide this action (${reason}).`;
}

function deciders(policy) {
  const who = [];
  if (policy.roles && policy.roles.length) who.push(`roles ${policy.roles.join(', ')}`);
  if (policy.subjects && policy.subjects.length) who.push(policy.subjects.join(', '));
  if (policy.groups && policy.groups.length) who.push(`groups ${policy.groups.join(', ')}`);
  return who.length ? who.join('; ') : 'anyone allowed';
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

/** "1 of 2 approvals, by Ada" (display names of the approvers so far). */
export function progressText(approval) {
  const quorum = approval.policy.quorum;
  const approvers = (approval.decisions || []).filter((d) => d.approved).map((d) => d.display_name || d.subject);
  const count = approval.approvals !== undefined ? approval.approvals : approvers.length;
  const noun = quorum === 1 ? 'approval' : 'approvals';
  return approvers.length ? `${count} of ${quorum} ${noun}, by ${approvers.join(', ')}` : `0 of ${quorum} ${noun}`;
}

/** The policy and progress rows of an approval card (nothing without a policy). */
export function renderApproval(approval) {
  if (!approval || !approval.policy) return null;
  const policy = approval.policy;
  const rules = [`needs ${policy.quorum} of: ${deciders(policy)}`];
  if (policy.exclude_requester) rules.push(`not the requester${approval.requester ? ` (${approval.requester})` : ''}`);
  const waiting = [];
  if (approval.waiting_for) waiting.push(`waiting for ${approval.waiting_for}`);
  if (approval.due_at) waiting.push(`due ${clock(approval.due_at)}`);
  if (approval.stage) {
    const stages = (policy.escalations || []).length + 1;
    waiting.push(`escalated: stage ${approval.stage + 1} of ${stages}`);
  }
  return h(
    'div',
    { class: 'card__approval', testid: 'approval' },
    h('p', { class: 'card__meta', testid: 'approval-policy' }, `Policy: ${rules.join(' · ')}`),
    h('p', { class: 'card__progress', testid: 'approval-progress', role: 'status' }, progressText(approval)),
    waiting.length ? h('p', { class: 'card__meta', testid: 'approval-deadline' }, waiting.join(', ')) : null,
    (approval.decisions || []).length
      ? h(
          'ul',
          { class: 'card__decisions', testid: 'approval-decisions' },
          approval.decisions.map((d) =>
            h('li', { testid: 'approval-decision' }, `${d.display_name || d.subject}: ${d.approved ? 'approved' : 'denied'}`),
          ),
        )
      : null,
  );
}

/** "Decided by Ada (approved), Bo (approved)" for a resolved part that had a policy, or what
 * its deadline did ("Denied automatically at the deadline: <reason>"). */
export function decidedText(resolution) {
  if (resolution && resolution.by_deadline) {
    const verdict = resolution.by_deadline === 'approve' ? 'Approved' : 'Denied';
    return `${verdict} automatically at the deadline: ${resolution.reason || 'no decision'}`;
  }
  const decisions = (resolution && resolution.decisions) || [];
  if (!decisions.length) return null;
  return `Decided by ${decisions.map((d) => `${d.display_name || d.subject} (${d.approved ? 'approved' : 'denied'})`).join(', ')}`;
}
