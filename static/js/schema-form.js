// JSON Schema (as pydantic's model_json_schema() emits it) -> form fields -> resume payload.
// The pure part (describeFields, collectPayload, mapServerErrors) is unit-tested in Node;
// buildSchemaForm touches the DOM only when called.

import { h } from './dom.js';

const SCALAR_KINDS = new Set(['boolean', 'string', 'number', 'integer']);

function deref(node, root, depth = 0) {
  if (!node || typeof node !== 'object' || depth > 16) return node || {};
  if (typeof node.$ref === 'string' && node.$ref.startsWith('#/')) {
    const target = node.$ref
      .slice(2)
      .split('/')
      .reduce((acc, key) => (acc && typeof acc === 'object' ? acc[key.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), root);
    const { $ref, ...rest } = node;
    return deref({ ...(target || {}), ...rest }, root, depth + 1);
  }
  if (Array.isArray(node.allOf) && node.allOf.length === 1) {
    const { allOf, ...rest } = node;
    return deref({ ...deref(allOf[0], root, depth + 1), ...rest }, root, depth + 1);
  }
  return node;
}

/** One field descriptor per top-level property, in schema order. */
export function describeFields(schema) {
  const root = schema || {};
  const top = deref(root, root);
  const props = top.properties || {};
  const required = new Set(Array.isArray(top.required) ? top.required : []);
  return Object.entries(props).map(([name, raw]) => describeField(name, raw, root, required.has(name)));
}

function describeField(name, raw, root, required) {
  let s = deref(raw, root);
  let nullable = false;
  const alternatives = s.anyOf || s.oneOf;
  if (Array.isArray(alternatives)) {
    const nonNull = alternatives.filter((alt) => deref(alt, root).type !== 'null');
    nullable = nonNull.length < alternatives.length;
    if (nonNull.length === 1) {
      const { anyOf, oneOf, ...outer } = s;
      s = { ...deref(nonNull[0], root), ...outer };
    } else {
      s = { ...s, type: 'json' };
    }
  }
  let type = s.type;
  if (Array.isArray(type)) {
    nullable = nullable || type.includes('null');
    const nonNull = type.filter((t) => t !== 'null');
    type = nonNull.length === 1 ? nonNull[0] : 'json';
  }
  let kind;
  let options;
  if (Array.isArray(s.enum)) {
    kind = 'enum';
    options = s.enum.filter((v) => v !== null);
    nullable = nullable || options.length < s.enum.length;
  } else if ('const' in s) {
    kind = 'enum';
    options = [s.const];
  } else if (SCALAR_KINDS.has(type)) {
    kind = type;
  } else {
    kind = 'json';
  }
  return {
    name,
    kind,
    options,
    required,
    nullable,
    // $ref'd definitions carry the *type's* title ("Color"); name the field after itself.
    title: (raw && raw.title) || humanize(name),
    description: s.description || '',
    default: s.default,
    minimum: s.minimum,
    maximum: s.maximum,
  };
}

function humanize(name) {
  const words = String(name).replace(/[_-]+/g, ' ').trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** A required boolean named `approved` is answered with Approve / Deny buttons. */
export function isApprovalForm(fields) {
  return fields.some((f) => f.name === 'approved' && f.kind === 'boolean' && f.required);
}

/**
 * Turn raw form values into a payload.
 * raw[name]: boolean for checkboxes; string for inputs; option index (string) for enums.
 * Returns {payload, errors: {name: message}}; empty optional fields are left out.
 */
export function collectPayload(fields, raw) {
  const payload = {};
  const errors = {};
  for (const f of fields) {
    const value = raw[f.name];
    if (f.kind === 'boolean') {
      if (value !== undefined) payload[f.name] = Boolean(value);
      else if (f.required) errors[f.name] = 'Required';
      continue;
    }
    const text = value === undefined || value === null ? '' : String(value);
    if (text.trim() === '' && f.kind !== 'string') {
      if (f.required) {
        if (f.nullable) payload[f.name] = null;
        else errors[f.name] = 'Required';
      }
      continue;
    }
    if (f.kind === 'string') {
      if (text === '' && !f.required) continue;
      payload[f.name] = text;
    } else if (f.kind === 'number' || f.kind === 'integer') {
      const num = Number(text);
      if (!Number.isFinite(num)) errors[f.name] = 'Enter a number';
      else if (f.kind === 'integer' && !Number.isInteger(num)) errors[f.name] = 'Enter a whole number';
      else payload[f.name] = num;
    } else if (f.kind === 'enum') {
      const index = Number(text);
      if (!Number.isInteger(index) || index < 0 || index >= f.options.length) errors[f.name] = 'Choose an option';
      else payload[f.name] = f.options[index];
    } else {
      try {
        payload[f.name] = JSON.parse(text);
      } catch {
        errors[f.name] = 'Enter valid JSON';
      }
    }
  }
  return { payload, errors };
}

/**
 * Map a 422 `errors` list ([{loc, msg}]) onto fields. `loc` may be [] (a missing required
 * property, named only in the message), ["approved"], or prefixed (["body", "payload", "x"]).
 * Returns {fields: {name: [msg]}, general: [msg]}.
 */
export function mapServerErrors(errors, fieldNames) {
  const names = new Set(fieldNames);
  const out = { fields: {}, general: [] };
  for (const err of Array.isArray(errors) ? errors : []) {
    const msg = err && err.msg ? String(err.msg) : 'Invalid value';
    const loc = Array.isArray(err && err.loc) ? err.loc.map(String) : [];
    let name = loc.find((part) => names.has(part));
    if (!name) {
      const quoted = /'([^']+)' is a required property/.exec(msg);
      if (quoted && names.has(quoted[1])) name = quoted[1];
    }
    if (name) (out.fields[name] ||= []).push(msg);
    else out.general.push(loc.length ? `${loc.join('.')}: ${msg}` : msg);
  }
  return out;
}

// --- DOM -------------------------------------------------------------------------------

/**
 * Build the form of a pending action. `onSubmit(payload)` is called with a valid payload.
 * Returns {element, setErrors({fields, general}), setBusy(bool)}.
 */
export function buildSchemaForm({ schema, idPrefix, onSubmit, disabled = false }) {
  const fields = describeFields(schema);
  const approval = isApprovalForm(fields);
  const controls = {};
  const errorEls = {};
  const general = h('p', { class: 'form-error', testid: 'action-error', role: 'alert', hidden: true });
  const rows = [];
  for (const f of fields) {
    if (approval && f.name === 'approved') continue;
    const id = `${idPrefix}-${f.name}`.replace(/[^A-Za-z0-9_-]/g, '_');
    const errorEl = h('p', { class: 'field-error', id: `${id}-error`, testid: `action-error-${f.name}`, hidden: true });
    const control = buildControl(f, id, disabled);
    control.setAttribute('aria-describedby', `${id}-error${f.description ? ` ${id}-hint` : ''}`);
    controls[f.name] = control;
    errorEls[f.name] = errorEl;
    const label = h('label', { for: id }, f.title, f.required ? null : h('span', { class: 'optional' }, ' (optional)'));
    const hint = f.description ? h('small', { class: 'hint', id: `${id}-hint` }, f.description) : null;
    rows.push(
      h('div', { class: `field field--${f.kind}` }, f.kind === 'boolean' ? [control, label] : [label, control], hint, errorEl),
    );
  }
  let decision = null;
  const buttons = approval
    ? [
        h('button', { type: 'submit', class: 'btn btn--primary', testid: 'approve-button', disabled, onclick: () => (decision = true) }, 'Approve'),
        h('button', { type: 'submit', class: 'btn btn--danger', testid: 'deny-button', disabled, onclick: () => (decision = false) }, 'Deny'),
      ]
    : [h('button', { type: 'submit', class: 'btn btn--primary', testid: 'action-submit', disabled }, 'Submit')];
  const form = h('form', { class: 'action-form', novalidate: true }, rows, general, h('div', { class: 'form-buttons' }, buttons));
  if (approval) errorEls.approved = general;

  function setErrors({ fields: fieldErrors = {}, general: generalErrors = [] }) {
    for (const [name, el] of Object.entries(errorEls)) {
      if (el === general) continue;
      const msgs = fieldErrors[name] || [];
      el.textContent = msgs.join('; ');
      el.hidden = msgs.length === 0;
      controls[name]?.setAttribute('aria-invalid', msgs.length ? 'true' : 'false');
    }
    const rest = [...generalErrors];
    if (approval && fieldErrors.approved) rest.push(...fieldErrors.approved.map((m) => `approved: ${m}`));
    for (const name of Object.keys(fieldErrors)) if (!errorEls[name]) rest.push(`${name}: ${fieldErrors[name].join('; ')}`);
    general.textContent = rest.join(' · ');
    general.hidden = rest.length === 0;
  }

  function setBusy(busy) {
    for (const el of form.querySelectorAll('button, input, select, textarea')) el.disabled = busy || disabled;
    form.setAttribute('aria-busy', busy ? 'true' : 'false');
  }

  if (approval) {
    // Enter in a text field must not silently "click" Approve (the form's default button).
    form.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && event.target instanceof HTMLInputElement) event.preventDefault();
    });
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const raw = {};
    for (const f of fields) {
      const el = controls[f.name];
      if (el) raw[f.name] = f.kind === 'boolean' ? el.checked : el.value;
    }
    if (approval) {
      const choice = event.submitter ? event.submitter.dataset.testid === 'approve-button' : decision;
      decision = null;
      if (choice === null || choice === undefined) return; // only the two buttons decide
      raw.approved = choice;
    }
    const { payload, errors } = collectPayload(fields, raw);
    const fieldErrors = Object.fromEntries(Object.entries(errors).map(([k, v]) => [k, [v]]));
    setErrors({ fields: fieldErrors });
    if (Object.keys(errors).length === 0) onSubmit(payload);
  });

  return { element: form, setErrors, setBusy, fieldNames: fields.map((f) => f.name) };
}

function buildControl(f, id, disabled) {
  const common = { id, name: f.name, testid: `action-${f.name}`, disabled, 'aria-required': f.required ? 'true' : null };
  if (f.kind === 'boolean') {
    return h('input', { ...common, type: 'checkbox', checked: f.default === true });
  }
  if (f.kind === 'enum') {
    const select = h('select', common, h('option', { value: '' }, f.required ? 'Choose…' : '—'));
    f.options.forEach((opt, i) => select.appendChild(h('option', { value: String(i), selected: opt === f.default }, String(opt))));
    return select;
  }
  if (f.kind === 'number' || f.kind === 'integer') {
    return h('input', {
      ...common,
      type: 'number',
      step: f.kind === 'integer' ? '1' : 'any',
      min: f.minimum,
      max: f.maximum,
      value: typeof f.default === 'number' ? String(f.default) : null,
    });
  }
  if (f.kind === 'json') {
    const value = f.default === undefined || f.default === null ? '' : JSON.stringify(f.default);
    const area = h('textarea', { ...common, rows: '3', placeholder: 'JSON', spellcheck: 'false' });
    area.value = value;
    return area;
  }
  return h('input', { ...common, type: 'text', value: typeof f.default === 'string' ? f.default : null });
}
