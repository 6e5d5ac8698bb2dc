// JSON Schema -> fields -> payload (static/js/schema-form.js), without a DOM.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { collectPayload, describeFields, isApprovalForm, mapServerErrors } from '../../../static/js/schema-form.js';

// As pydantic 2 prints them (model_json_schema()).
const APPROVAL = {
  properties: {
    approved: { title: 'Approved', type: 'boolean' },
    note: { anyOf: [{ type: 'string' }, { type: 'null' }], default: null, title: 'Note' },
  },
  required: ['approved'],
  title: 'Approval',
  type: 'object',
};

const OTHER = {
  $defs: {
    Color: { enum: ['red', 'green'], title: 'Color', type: 'string' },
    Inner: { properties: { a: { title: 'A', type: 'integer' } }, required: ['a'], title: 'Inner', type: 'object' },
  },
  properties: {
    color: { $ref: '#/$defs/Color' },
    maybe_color: { anyOf: [{ $ref: '#/$defs/Color' }, { type: 'null' }], default: null },
    mode: { default: 'fast', enum: ['fast', 'slow'], title: 'Mode', type: 'string' },
    count: { description: 'How many', minimum: 0, title: 'Count', type: 'integer' },
    ratio: { anyOf: [{ type: 'number' }, { type: 'null' }], default: null, title: 'Ratio' },
    inner: { anyOf: [{ $ref: '#/$defs/Inner' }, { type: 'null' }], default: null },
    tags: { default: [], items: { type: 'string' }, title: 'Tags', type: 'array' },
    legacy: { allOf: [{ $ref: '#/$defs/Color' }], title: 'Legacy' },
    fixed: { const: 42 },
  },
  required: ['color', 'count'],
  title: 'Other',
  type: 'object',
};

const byName = (fields) => Object.fromEntries(fields.map((f) => [f.name, f]));

describe('describeFields', () => {
  test('the approval schema: a required boolean and an optional nullable string', () => {
    const fields = describeFields(APPROVAL);
    assert.deepEqual(fields.map((f) => [f.name, f.kind, f.required, f.nullable]), [
      ['approved', 'boolean', true, false],
      ['note', 'string', false, true],
    ]);
    assert.equal(isApprovalForm(fields), true);
    assert.equal(fields[1].title, 'Note');
  });

  test('enums through $ref, anyOf-null, allOf and const; numbers; nested types as JSON', () => {
    const f = byName(describeFields(OTHER));
    assert.equal(f.color.kind, 'enum');
    assert.deepEqual(f.color.options, ['red', 'green']);
    assert.equal(f.color.required, true);
    assert.equal(f.color.title, 'Color');
    assert.equal(f.maybe_color.kind, 'enum');
    assert.equal(f.maybe_color.nullable, true);
    assert.equal(f.maybe_color.title, 'Maybe color');
    assert.equal(f.mode.kind, 'enum');
    assert.equal(f.mode.default, 'fast');
    assert.equal(f.count.kind, 'integer');
    assert.equal(f.count.minimum, 0);
    assert.equal(f.count.description, 'How many');
    assert.equal(f.ratio.kind, 'number');
    assert.equal(f.inner.kind, 'json');
    assert.equal(f.tags.kind, 'json');
    assert.equal(f.legacy.kind, 'enum');
    assert.equal(f.legacy.title, 'Legacy');
    assert.deepEqual(f.fixed.options, [42]);
    assert.equal(isApprovalForm(Object.values(f)), false);
  });

  test('an optional boolean named approved is not an approval form; empty schemas give no fields', () => {
    assert.equal(isApprovalForm(describeFields({ properties: { approved: { type: 'boolean' } } })), false);
    assert.deepEqual(describeFields({}), []);
    assert.deepEqual(describeFields(undefined), []);
  });
});

describe('collectPayload', () => {
  test('approval payloads: the decision, and the note only when given', () => {
    const fields = describeFields(APPROVAL);
    assert.deepEqual(collectPayload(fields, { approved: true, note: '' }), { payload: { approved: true }, errors: {} });
    assert.deepEqual(collectPayload(fields, { approved: false, note: 'no' }), {
      payload: { approved: false, note: 'no' },
      errors: {},
    });
  });

  test('coercion and client-side errors', () => {
    const fields = describeFields(OTHER);
    const ok = collectPayload(fields, {
      color: '1',
      maybe_color: '',
      mode: '0',
      count: '3',
      ratio: '0.5',
      inner: '{"a": 1}',
      tags: '',
      legacy: '0',
      fixed: '0',
    });
    assert.deepEqual(ok.errors, {});
    assert.deepEqual(ok.payload, { color: 'green', mode: 'fast', count: 3, ratio: 0.5, inner: { a: 1 }, legacy: 'red', fixed: 42 });

    const bad = collectPayload(fields, { color: '', count: '2.5', ratio: 'x', inner: '{', mode: '7' });
    assert.deepEqual(bad.errors, {
      color: 'Required',
      count: 'Enter a whole number',
      ratio: 'Enter a number',
      inner: 'Enter valid JSON',
      mode: 'Choose an option',
    });
  });

  test('a required string may be empty; a required nullable number left empty is null', () => {
    const fields = describeFields({
      properties: { s: { type: 'string' }, n: { anyOf: [{ type: 'number' }, { type: 'null' }] } },
      required: ['s', 'n'],
    });
    assert.deepEqual(collectPayload(fields, { s: '', n: '' }), { payload: { s: '', n: null }, errors: {} });
  });
});

describe('mapServerErrors', () => {
  test('field locations, prefixed locations, a missing required property, and the rest', () => {
    const out = mapServerErrors(
      [
        { loc: ['note'], msg: 'too long' },
        { loc: ['body', 'payload', 'count'], msg: 'must be >= 0' },
        { loc: [], msg: "'approved' is a required property" },
        { loc: ['elsewhere'], msg: 'odd' },
        { loc: [], msg: 'whole payload is wrong' },
      ],
      ['approved', 'note', 'count'],
    );
    assert.deepEqual(out.fields, { note: ['too long'], count: ['must be >= 0'], approved: ["'approved' is a required property"] });
    assert.deepEqual(out.general, ['elsewhere: odd', 'whole payload is wrong']);
  });

  test('garbage in, nothing thrown', () => {
    assert.deepEqual(mapServerErrors(undefined, ['a']), { fields: {}, general: [] });
    assert.deepEqual(mapServerErrors([null, {}], []), { fields: {}, general: ['Invalid value', 'Invalid value'] });
  });
});
